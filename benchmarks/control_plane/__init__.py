"""The Planner and the control path: plan time, tickets vs rank streams, ranks at scale, the plan journal,
the audit, load."""
