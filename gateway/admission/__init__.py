"""Admission: per-model queues in front of the replicas, by priority class and fair share.

`AdmissionController` is the whole interface; the other modules are its parts. See
docs/admission-algorithm.md for the algorithm and its fairness bound.
"""

from gateway.admission.errors import DeadlineExceeded, Overloaded, ReplicaStarting, Shed
from gateway.admission.queue import AdmissionController, ClassDemand, ModelSnapshot, Slot

__all__ = [
    "AdmissionController",
    "ClassDemand",
    "DeadlineExceeded",
    "ModelSnapshot",
    "Overloaded",
    "ReplicaStarting",
    "Shed",
    "Slot",
]
