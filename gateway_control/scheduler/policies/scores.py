"""Node scores shared by several policies. Pure."""

from __future__ import annotations

from gateway_control.scheduler.cluster import GPU_MILLI, Node, Pod


def remaining_score(node: Node, pod: Pod) -> float:
    """Best-fit's measure: what the node has left after taking `pod`, as the sum of its
    free GPU and free CPU fractions (each relative to the node's capacity).

    Memory is left out: it never binds on the openb nodes, and with it the baseline
    lands further from the paper's BestFit number (8.4 against 7.09 unallocated).
    """
    score = 0.0
    if node.gpus:
        score += (node.gpu_free_milli - pod.requested_milli) / (node.gpus * GPU_MILLI)
    if node.cpu_milli:
        score += (node.cpu_free - pod.cpu_milli) / node.cpu_milli
    return score
