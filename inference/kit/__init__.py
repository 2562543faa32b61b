"""The request kit every data-plane surface uses: the gate (auth → rate limit → body → validate),
admission (:class:`inference.admission.Admission`) and the transport-agnostic attempts loop."""

from __future__ import annotations

from inference.kit.attempts import Answer, RoutePlan, run_attempts, run_turn
from inference.kit.gate import Passed, Validator, pass_gate

__all__ = ["Answer", "Passed", "RoutePlan", "Validator", "pass_gate", "run_attempts", "run_turn"]
