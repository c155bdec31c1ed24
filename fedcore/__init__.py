"""What server and clients share: the run-config schema, the method registry, the wire format, each
method's message contract (``fedcore.contracts``), the models and the maths both sides compute."""
