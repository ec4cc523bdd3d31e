"""Slots, range maps, the pure planner and the assignment/handoff protocol."""
