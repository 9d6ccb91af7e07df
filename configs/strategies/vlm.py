"""Vision-language pretraining (the OVERLORD paper's Fig. 9, right).

The backbone sees sequences (text with image placeholder runs): cost a*l + b*l^2, balanced over
the data-parallel ranks, and TP rank 0 broadcasts them. The vision encoder sees images: they are
balanced by their own cost over every rank (WORLD), independently of where their sequence goes,
because an image-heavy short sequence and a text-heavy long one load the two modules very
differently. Trainers send the image embeddings back to the sequence's owner (all-to-all).

``encoder_b`` (``strategy: {file: ..., options: {encoder_b: ...}}``): the encoder's cost per pair of
patches of one image over its cost per patch (a ViT's 12 * layers * hidden / (6 * params); 8e-5 for
a 2B ViT of 48 layers, hidden 1664).
"""


def build(s, encoder_b=1 / 1024):
    (s.cost("attention").distribute("DP").balance("greedy").broadcast_at("TP"))        # backbone
    s.images().cost("patches", a=1.0, b=encoder_b).distribute("WORLD").balance("karmarkar_karp")  # encoder
    return s
