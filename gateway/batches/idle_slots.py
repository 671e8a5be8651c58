"""The slots a model's admission leaves to batch lines: none while an online request
waits, else what is free of them (this gateway's own view of its queues)."""

from __future__ import annotations

from gateway.admission import AdmissionController
from gateway.admission.queue import BATCH_API_CLASS


class AdmissionIdleSlots:
    """`batch_worker.IdleSlots` read from this gateway's admission controller."""

    def __init__(self, admission: AdmissionController, reserve: int = 0) -> None:
        self._admission = admission
        # Slots of each model left to online arrivals (`batches.reserve_slots`).
        self._reserve = reserve

    def free_for_batch(self, model: str, mine: int) -> int:
        """Free slots, less this gateway's batch lines (`mine`) not holding one yet and
        the slots reserved for online arrivals; 0 while anything waits in the model's
        queue (an online request, or a batch line already behind it)."""
        try:
            snapshot = self._admission.snapshot(model)
        except KeyError:
            return 0  # a model no longer configured here
        if any(snapshot.queued.values()):
            return 0
        batch = snapshot.by_class.get(BATCH_API_CLASS)
        holding = 0 if batch is None else batch.in_flight
        free = snapshot.capacity - self._reserve - snapshot.in_flight
        return max(0, free - max(0, mine - holding))
