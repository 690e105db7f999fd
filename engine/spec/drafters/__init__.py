"""Drafters behind one interface (base.Drafter): the draft model, the n-gram lookup, and the two together."""
from engine.spec.drafters.base import Drafter, Outcome, Proposal
from engine.spec.drafters.hybrid import HybridDrafter
from engine.spec.drafters.model import ModelDrafter
from engine.spec.drafters.ngram import NGramDrafter

__all__ = ["Drafter", "HybridDrafter", "ModelDrafter", "NGramDrafter", "Outcome", "Proposal"]
