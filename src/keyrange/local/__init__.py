"""Running on one machine: the embedded broker and the local supervisor behind `keyrange run`."""
