"""Image-text samples: transform cost, decoding at the constructor vs the loader."""
