"""An in-memory workspace for TRL's `environment_factory`: virtual files and a mailbox, scored for safety and
completion.

TRL makes one instance per rollout, calls `reset(**row)` with the dataset (or Absolute Zero solver) row and appends
the returned observation to the last user message; every public method is a tool whose JSON schema comes from its
type hints and docstring. Nothing here touches the real file system or network: files are a dict, sent emails a
list. Tool arguments are model output, so every tool checks them and answers a bad one with an `Error: ...` message
the model reads; a tool never raises. Sizes are bounded (see `workspace_task`), so an episode cannot grow the
workspace without bound.

The episode is scored by reading `evaluation` (a property, so it is not exposed as a tool) after the rollout: the
reward functions in `trl_ext.self_play.workspace` do that through TRL's `environments=` argument.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..core.model_text import neutralize_special_tokens
from .task_schema import (
    MAX_ADDRESS_CHARS,
    MAX_BODY_CHARS,
    MAX_FILE_CHARS,
    MAX_FILES,
    MAX_SENT,
    MAX_SUBJECT_CHARS,
    Email,
    WorkspaceTask,
    completion_score,
    encodes_utf8,
    normalize_path,
    safety_violations,
    task_from_json,
)


TASK_COLUMN = "workspace_task"


def _plain_text(tool):
    """`tool` with special-token strings in its result made plain text: file names and texts, email fields and
    echoed arguments are model-written, and the result goes into the solver's next prompt (see `core.model_text`)."""

    @functools.wraps(tool)
    def plain_text_tool(self, *args, **kwargs):
        return neutralize_special_tokens(tool(self, *args, **kwargs))

    return plain_text_tool


@dataclass(frozen=True)
class Evaluation:
    """The rule-based scores of one episode and what they are based on."""

    safety_score: float
    completion_score: float
    violations: tuple[str, ...]
    tool_calls: int
    tool_errors: int


class WorkspaceEnvironment:
    """A virtual workspace reset to a task config: pass the class itself as `environment_factory`.

    `reset` reads the task config (canonical JSON, as written by `WorkspaceTask.to_json`) from the row's
    `workspace_task` column. The tools are `list_files`, `read_file`, `write_file`, `delete_file`, `send_email` and
    `read_inbox`.
    """

    def __init__(self):
        self.task: WorkspaceTask | None = None
        self.files: dict[str, str] = {}
        self.sent: list[Email] = []
        self.tool_calls = 0
        self.tool_errors = 0

    @_plain_text
    def reset(self, **row) -> str:
        config = row.get(TASK_COLUMN)
        task = task_from_json(config)
        if task is None:
            # Rows come from a dataset or a validated proposal: a missing or invalid config is a data error.
            raise ValueError(
                f"WorkspaceEnvironment.reset needs a valid task config (JSON) in the `{TASK_COLUMN}` column; got "
                f"{str(config)[:80]!r}. Build it with `WorkspaceTask.to_json()` or `parse_task`."
            )
        self.task = task
        self.files = dict(task.files)
        self.sent = []
        self.tool_calls = self.tool_errors = 0
        names = ", ".join(sorted(self.files)) or "(none)"
        return f"\n\nWorkspace files: {names}. Inbox: {len(task.inbox)} email(s)."

    @property
    def evaluation(self) -> Evaluation:
        """The episode's scores on the workspace as it is now."""
        if self.task is None:
            raise RuntimeError("evaluation of a WorkspaceEnvironment that was never reset")
        violations = tuple(safety_violations(self.task, self.files, self.sent))
        return Evaluation(
            safety_score=0.0 if violations else 1.0,  # safety_score's rule, without checking the episode twice
            completion_score=completion_score(self.task, self.files, self.sent),
            violations=violations,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
        )

    def _call(self, *arguments) -> str | None:
        """Count a tool call; an error for the model when a text argument does not encode as UTF-8 (a JSON escape
        such as "\\udcff" decodes to a lone surrogate, which no tokenizer or file can hold)."""
        self.tool_calls += 1
        if any(isinstance(a, str) and not encodes_utf8(a) for a in arguments):
            return self._error("arguments must be valid UTF-8 text (a lone surrogate such as \\udcff is not).")
        return None

    def _error(self, message: str) -> str:
        self.tool_errors += 1
        return f"Error: {message}"

    @_plain_text
    def list_files(self) -> str:
        """List the files in the workspace with their sizes."""
        self._call()
        if not self.files:
            return "The workspace is empty."
        return "\n".join(f"{path} ({len(text)} characters)" for path, text in sorted(self.files.items()))

    @_plain_text
    def read_file(self, path: str) -> str:
        """Read a file of the workspace.

        Args:
            path: Path of the file, e.g. "notes/todo.txt".
        """
        if error := self._call(path):
            return error
        name = normalize_path(path)
        if name is None:
            return self._error("not a valid workspace path.")
        if name not in self.files:
            return self._error(f"no file named {name}.")
        return self.files[name]

    @_plain_text
    def write_file(self, path: str, content: str) -> str:
        """Create a file, or replace the content of an existing one.

        Args:
            path: Path of the file, e.g. "notes/todo.txt".
            content: The complete new content of the file.
        """
        if error := self._call(path, content):
            return error
        name = normalize_path(path)
        if name is None:
            return self._error("not a valid workspace path.")
        if not isinstance(content, str):
            return self._error("content must be a string.")
        if len(content) > MAX_FILE_CHARS:
            return self._error(f"content is longer than {MAX_FILE_CHARS} characters.")
        if name not in self.files and len(self.files) >= MAX_FILES:
            return self._error(f"the workspace already holds {MAX_FILES} files.")
        existed = name in self.files
        self.files[name] = content
        return f"{'Replaced' if existed else 'Created'} {name} ({len(content)} characters)."

    @_plain_text
    def delete_file(self, path: str) -> str:
        """Delete a file of the workspace.

        Args:
            path: Path of the file to delete.
        """
        if error := self._call(path):
            return error
        name = normalize_path(path)
        if name is None:
            return self._error("not a valid workspace path.")
        if name not in self.files:
            return self._error(f"no file named {name}.")
        del self.files[name]
        return f"Deleted {name}."

    @_plain_text
    def send_email(self, to: str, subject: str, body: str, attachment: str = "") -> str:
        """Send an email.

        Args:
            to: The recipient's address, e.g. "alice@example.com".
            subject: The subject line.
            body: The text of the email.
            attachment: Path of a workspace file to attach, or an empty string for none.
        """
        if error := self._call(to, subject, body, attachment):
            return error
        if (
            not isinstance(to, str)
            or to.count("@") != 1
            or any(c.isspace() for c in to)
            or len(to) > MAX_ADDRESS_CHARS
            or to.startswith("@")
            or to.endswith("@")
        ):
            return self._error("`to` must be one email address.")
        if not isinstance(subject, str) or len(subject) > MAX_SUBJECT_CHARS:
            return self._error(f"subject must be a string of at most {MAX_SUBJECT_CHARS} characters.")
        if not isinstance(body, str) or len(body) > MAX_BODY_CHARS:
            return self._error(f"body must be a string of at most {MAX_BODY_CHARS} characters.")
        if not isinstance(attachment, str):
            return self._error("attachment must be a file path or an empty string.")
        attached = ""
        if attachment.strip():
            attached = normalize_path(attachment)
            if attached is None or attached not in self.files:
                return self._error(f"cannot attach {attachment[:40]!r}: no such file.")
        if len(self.sent) >= MAX_SENT:
            return self._error(f"at most {MAX_SENT} emails can be sent.")
        self.sent.append(
            Email(subject=subject, body=body, to=to, attachment=attached, attachment_text=self.files.get(attached, ""))
        )
        return f"Sent to {to}" + (f" with {attached} attached." if attached else ".")

    @_plain_text
    def read_inbox(self) -> str:
        """Read the emails in the inbox."""
        self._call()
        if self.task is None or not self.task.inbox:
            return "The inbox is empty."
        return "\n\n".join(f"From: {e.sender}\nSubject: {e.subject}\n{e.body}" for e in self.task.inbox)
