"""Topology-aware placement: whole-node reservation for large jobs, and jobs too big for one
node spread over the nodes of one interconnect domain (a gang). Pure: no I/O.

Domains: a node's `domain` field when set. The openb node list has none, so nodes without
one are grouped in racks of `rack_size` consecutive nodes of the list (`rack-0`,
`rack-1`, ...): the list is ordered by node type, so a rack is mostly one type, as racks
usually are.

Reservation: a job is large on a node when it asks for all of the node's GPUs or for more
than `large_gpus` GPUs. A large job only goes to an otherwise empty node (no GPU, CPU or
memory in use), and that node then takes nothing else until the job leaves (`released`),
so a large job never shares a node's PCIe/NVLink fabric, CPU or memory with another pod.
Other pods are placed by the inner policy (fragmentation-aware, `fgd-plus`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway_control.scheduler.cluster import GPU_MILLI, Cluster, Node, Placement, Pod
from gateway_control.scheduler.fragmentation import Shape
from gateway_control.scheduler.policies.fgd_plus import FragmentationGradientPlus

RACK_SIZE = 8  # nodes per interconnect domain when the node list names none
LARGE_GPUS = 4  # a job asking for more GPUs than this takes a whole node


def node_domains(nodes: Sequence[Node], rack_size: int = RACK_SIZE) -> list[str]:
    """Each node's domain: its own `domain`, else `rack-<k>` for the k-th run of
    `rack_size` consecutive nodes."""
    if rack_size < 1:
        raise ValueError("rack_size must be at least 1")
    return [node.domain or f"rack-{i // rack_size}" for i, node in enumerate(nodes)]


def is_empty(node: Node) -> bool:
    """Whether nothing is placed on `node` (all GPU, CPU and memory free)."""
    return (
        node.cpu_free == node.cpu_milli
        and node.memory_free == node.memory_mib
        and all(free == GPU_MILLI for free in node.gpu_free)
    )


@dataclass(frozen=True, slots=True)
class GangMember:
    """One node's part of a job: the pod to bind there and where."""

    pod: Pod
    placement: Placement


class TopologyAware(FragmentationGradientPlus):
    """`fgd-plus` with whole-node reservation for large jobs, plus `choose_gang` for jobs
    that need more than one node: one node if possible, else whole nodes of one domain."""

    name = "topology"

    def __init__(
        self,
        shapes: Sequence[Shape],
        rack_size: int = RACK_SIZE,
        large_gpus: int = LARGE_GPUS,
    ) -> None:
        super().__init__(shapes)
        self.rack_size = rack_size
        self.large_gpus = large_gpus
        self.domains: list[str] = []
        self._held: dict[int, int] = {}  # node index -> large jobs on it (0 or 1)

    def bind(self, cluster: Cluster) -> None:
        """Start placing on `cluster`; nodes without a domain get a rack."""
        super().bind(cluster)
        self.domains = node_domains(cluster.nodes, self.rack_size)
        self._held = {}

    def is_large(self, pod: Pod, node: Node) -> bool:
        """Whether `pod` must have `node` to itself (a share of a GPU never does)."""
        if pod.num_gpu == 0 or pod.shared:
            return False
        return pod.num_gpu >= node.gpus or pod.num_gpu > self.large_gpus

    def placed(self, pod: Pod, placement: Placement) -> None:
        """Refresh caches; a large job holds its node until `released`."""
        super().placed(pod, placement)
        if self.is_large(pod, self.cluster.nodes[placement.node]):
            self._held[placement.node] = self._held.get(placement.node, 0) + 1

    def released(self, pod: Pod, placement: Placement) -> None:
        """Refresh caches after the cluster took `placement` back; frees a held node."""
        super().released(pod, placement)
        if self._held.get(placement.node):
            self._held[placement.node] -= 1
            if not self._held[placement.node]:
                del self._held[placement.node]

    filtered = True  # consult `skip`: held nodes, and non-empty ones for large jobs

    def skip(self, pod: Pod, index: int) -> bool:
        """Held nodes take nothing else; a large job takes only an empty node."""
        node = self.cluster.nodes[index]
        return index in self._held or (self.is_large(pod, node) and not is_empty(node))

    def choose_gang(self, pod: Pod) -> tuple[GangMember, ...] | None:
        """Where a job goes: one node if any fits it (the usual `choose`); else, for a job
        of whole GPUs, empty nodes of one domain, each member taking all of its node's
        GPUs (the last one what is left) with CPU and memory pro rata. Among domains that
        can take the job, the one with the fewest empty-node GPUs (keeps big domains
        whole for bigger jobs), then the first. None when nothing fits; nothing is placed:
        bind each member with `Cluster.place` and report it with `placed`."""
        single = self.choose(pod)
        if single is not None:
            return (GangMember(pod, single),)
        if pod.shared or pod.num_gpu < 2:
            return None
        by_domain: dict[str, list[int]] = {}
        for index, node in enumerate(self.cluster.nodes):
            if (
                node.gpus
                and index not in self._held
                and node.healthy
                and is_empty(node)
                and pod.allows(node.gpu_model)
            ):
                by_domain.setdefault(self.domains[index], []).append(index)
        best: tuple[int, int, tuple[GangMember, ...]] | None = None
        for order, indices in enumerate(by_domain.values()):
            members = self._split(pod, indices)
            if members is None:
                continue
            free = sum(self.cluster.nodes[i].gpus for i in indices)
            if best is None or (free, order) < best[:2]:
                best = (free, order, members)
        return best[2] if best else None

    def _split(self, pod: Pod, indices: list[int]) -> tuple[GangMember, ...] | None:
        """Members of `pod` on empty nodes among `indices`, biggest nodes first (fewest
        members), or None if they cannot hold it (GPU, CPU or memory)."""
        nodes = self.cluster.nodes
        members: list[GangMember] = []
        left = pod.num_gpu
        for index in sorted(indices, key=lambda i: (-nodes[i].gpus, i)):
            if left == 0:
                break
            node = nodes[index]
            take = min(node.gpus, left)
            member = replace(
                pod,
                name=f"{pod.name}/{len(members)}",
                num_gpu=take,
                cpu_milli=pod.cpu_milli * take // pod.num_gpu,
                memory_mib=pod.memory_mib * take // pod.num_gpu,
            )
            if not member.fits(node):
                continue
            members.append(GangMember(member, Placement(index, member.gpu_choice(node))))
            left -= take
        return tuple(members) if left == 0 else None
