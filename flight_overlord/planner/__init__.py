"""planner role."""
