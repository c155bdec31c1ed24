"""What server and clients share: the run-config schema, the method registry and the wire format."""
