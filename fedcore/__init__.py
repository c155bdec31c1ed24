"""What server and clients share: the run-config schema, the method registry, the wire format, each
method's declaration (``fedcore.methods``: message contract, hyperparameters, paper settings), the
models and the maths both sides compute."""
