"""Quotas: the `Admit` stage (reserve before the call, settle after) and `RetryDiscipline` (admission.py)."""
