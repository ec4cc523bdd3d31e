"""The Kubernetes operator: kopf handlers (`handlers`), pure rendering (`rendering`, `status`),
the range-control seam (`assignments`) and the few modules that talk to the API (`kube`)."""
