"""Long-short context LLM training on a 4D mesh (the OVERLORD paper's Fig. 9, left).

A curriculum moves the mixture from short sources towards long documents; samples are costed
a*l + b*l^2 and balanced over the data-parallel ranks, then over each rank's microbatches;
context parallelism splits every packed sequence (load-balanced, from the mesh config), and
TP rank 0 broadcasts to its tensor-parallel peers, so only it receives tokens.
"""
from flight_overlord.orchestration import linear

SHORT = {"captions": 0.30, "docstrings": 0.20, "qa": 0.20, "code": 0.15, "manuals": 0.10, "longdocs": 0.05}
LONG = {"captions": 0.10, "docstrings": 0.10, "qa": 0.10, "code": 0.20, "manuals": 0.10, "longdocs": 0.40}


def build(s, curriculum_steps: int = 40):
    return (s.mix(linear(SHORT, LONG, start=0, end=curriculum_steps))
             .cost("attention")
             .distribute("DP")
             .balance("greedy", level="both")
             .broadcast_at("TP"))
