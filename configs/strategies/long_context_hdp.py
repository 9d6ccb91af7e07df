"""Long-context training with dynamic context-parallel groups (HDP, ByteScale / Megatron-Core's
dynamic CP): each sample gets a power-of-two group of the DP x CP ranks from its length (about
ceil_pow2(length / max_tokens_per_rank), at least min_cp), short samples are packed whole onto
single ranks and pay no CP communication, and attention work (a*l + b*l^2, a g-th of it on each
rank of a group of g under the THD split) is balanced over all DP x CP ranks, microbatch by
microbatch; ``widen`` doubles the group of a sample whose work would exceed a rank's fair share of
a microbatch (so one long sample does not idle the rest of the domain). Each rank gets its sequences
with the group of each (schemas/hdp_microbatch.json).
"""


def build(s, max_tokens_per_rank: int = 32768, min_cp: int = 1, widen: bool = True):
    return (s.cost("attention")                                   # a*l + b*l^2 from the config
             .distribute("HDP", max_tokens_per_rank=max_tokens_per_rank, min_cp=min_cp, widen=widen))
