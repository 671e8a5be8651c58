"""The control plane: where model replicas run (placement, the closed loop, the
scheduler's policies and simulators). It attaches to a serving process through the
interface `gateway.serving.attachment` defines; the server never imports it."""
