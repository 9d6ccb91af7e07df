"""Placement: the balancing library, a cost model fitted to trainer timings, dynamic CP groups (HDP)."""
