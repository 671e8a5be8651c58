"""The prompt template: how a task is put to a model, fixed and versioned.

A template is a YAML file with `name`, `version`, `system` and `user`; `user` holds
`{instruction}` and `{files}`, which are replaced by the task's instruction and its
snapshot's files. The shipped one is `templates/code-change.yaml` next to this module.
Its digest goes into every run's manifest: two runs compare only under the same template.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from gateway_tools.eval.suite import Task
from gateway_tools.eval.yaml_files import read_yaml

DEFAULT_TEMPLATE = Path(__file__).with_name("templates") / "code-change.yaml"
_FIELDS = ("name", "version", "system", "user")


@dataclass(frozen=True, slots=True)
class Template:
    """A loaded prompt template."""

    name: str
    version: str
    system: str
    user: str
    digest: str  # sha256 of the file's bytes

    def messages(self, task: Task) -> list[dict[str, str]]:
        """The chat messages that put `task` to a model."""
        files = "\n\n".join(
            f"FILE: {path}\n```\n{text.rstrip()}\n```" for path, text in task.snapshot
        )
        user = self.user.replace("{instruction}", task.instruction).replace("{files}", files)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


def load_template(path: Path = DEFAULT_TEMPLATE) -> Template:
    """Load a template; ValueError (`file: why`) when it is not one."""
    data = read_yaml(path, "template")
    if not isinstance(data, dict) or any(not isinstance(data.get(k), str | int) for k in _FIELDS):
        raise ValueError(f"{path}: a template needs {', '.join(_FIELDS)}")
    if "{instruction}" not in data["user"] or "{files}" not in data["user"]:
        raise ValueError(f"{path}: `user` must hold {{instruction}} and {{files}}")
    return Template(
        name=str(data["name"]),
        version=str(data["version"]),
        system=str(data["system"]).strip(),
        user=str(data["user"]).strip(),
        digest=hashlib.sha256(path.read_bytes()).hexdigest(),
    )
