"""Server side: the ServerApp, its round loop, results and the run launcher."""
