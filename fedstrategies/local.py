"""Local: every client trains its own model alone; nothing but the round number crosses the wire."""

from fedstrategies.base import PersonalizedStrategy


class LocalStrategy(PersonalizedStrategy):
    """No aggregation at all: the lower bound every personalised method has to beat."""
