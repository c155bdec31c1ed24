"""Server side: one module per method (a Strategy subclass plus its pure aggregation math)."""
