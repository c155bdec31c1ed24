"""Client side: one module per method (its local update), models, shared training loops, the ClientApp."""
