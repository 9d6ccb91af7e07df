"""Vision-language pretraining (the OVERLORD paper's Fig. 9, right).

The backbone sees sequences (text with image placeholder runs): cost a*l + b*l^2, balanced over
the data-parallel ranks, and TP rank 0 broadcasts them. The vision encoder sees images: they are
balanced by their own cost over every rank (WORLD), independently of where their sequence goes,
because an image-heavy short sequence and a text-heavy long one load the two modules very
differently. Trainers send the image embeddings back to the sequence's owner (all-to-all).
"""


def build(s):
    (s.cost("attention").distribute("DP").balance("greedy").broadcast_at("TP"))        # backbone
    s.images().cost("patches", a=1.0, b=1 / 1024).distribute("WORLD").balance("karmarkar_karp")  # encoder
    return s
