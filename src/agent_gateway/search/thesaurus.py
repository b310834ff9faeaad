"""Words people use for what tools call otherwise: the query expansion of the tool index.

Each group holds phrases that name the same action or thing in tool catalogs ("remove" for a
tool called ``delete_file``, "ticket" for ``create_issue``, "PR" for a merge request). A query
phrase found in a group adds the group's other phrases to the query at a lower weight, so a
request that shares no word with the right tool's name can still find it.

Written from the vocabulary of public tool catalogs and APIs (CRUD verbs, issue trackers, code
hosting, chat, mail, calendars, files, databases, browsers, cloud, observability, payments), not
from any benchmark query: see bench/README.md for how it was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from agent_gateway.search.text import terms

GROUPS: tuple[tuple[str, ...], ...] = (
    # -- actions ---------------------------------------------------------------------------
    ("create", "add", "new", "make", "insert", "register", "generate", "set up", "open", "start"),
    ("delete", "remove", "drop", "destroy", "erase", "purge", "trash", "discard", "get rid of", "wipe"),
    ("update", "edit", "modify", "change", "patch", "alter", "adjust", "rename", "replace", "set"),
    (
        "get",
        "fetch",
        "read",
        "retrieve",
        "show",
        "view",
        "look up",
        "lookup",
        "describe",
        "detail",
        "info",
        "inspect",
        "see",
        "display",
        "check",
        "load",
    ),
    ("list", "show all", "enumerate", "browse", "all", "index", "overview", "what are"),
    ("search", "find", "query", "look for", "locate", "discover", "filter", "grep", "match", "which"),
    ("send", "post", "publish", "notify", "message", "tell", "ping", "dm", "broadcast", "announce"),
    ("run", "execute", "invoke", "trigger", "launch", "perform", "call", "kick off", "fire"),
    ("stop", "halt", "kill", "terminate", "shut down", "shutdown", "abort", "cancel", "pause", "disable"),
    ("start", "boot", "resume", "enable", "turn on", "power on", "spin up", "restart", "reboot"),
    ("upload", "attach", "put", "push", "import"),
    ("download", "export", "save", "pull", "dump", "backup"),
    ("close", "resolve", "finish", "complete", "done", "mark done", "fix", "settle"),
    ("reopen", "open again", "unresolve"),
    ("assign", "delegate", "allocate", "hand over", "give to", "owner", "assignee"),
    ("comment", "reply", "respond", "note", "remark", "annotate", "feedback"),
    ("merge", "combine", "integrate", "land"),
    ("deploy", "ship", "release", "rollout", "roll out", "promote", "go live"),
    ("rollback", "roll back", "revert", "undo", "downgrade"),
    ("schedule", "plan", "book", "arrange", "set up a meeting"),
    ("invite", "add member", "share with", "grant access"),
    ("share", "permission", "access", "grant", "allow"),
    ("move", "relocate", "transfer", "migrate"),
    ("copy", "duplicate", "clone", "fork"),
    ("screenshot", "screen shot", "capture", "snapshot", "screen grab", "picture of the page"),
    ("navigate", "go to", "visit", "open url", "browse to", "load page"),
    ("click", "press", "tap", "select"),
    ("type", "fill", "enter text", "input", "write into"),
    ("scroll", "swipe"),
    ("wait", "sleep", "delay"),
    ("summarize", "summary", "digest", "recap", "tl dr"),
    ("translate", "convert", "transform"),
    ("count", "how many", "number of", "total", "statistics", "stats"),
    ("monitor", "watch", "observe", "track"),
    ("acknowledge", "ack", "accept", "confirm"),
    ("escalate", "page", "alert", "wake up"),
    ("subscribe", "follow", "watch"),
    ("unsubscribe", "unfollow", "mute"),
    ("star", "favorite", "bookmark", "like", "pin"),
    ("tag", "label", "categorize", "mark"),
    ("lock", "protect", "freeze"),
    ("archive", "shelve", "hide"),
    ("restore", "recover", "undelete", "unarchive"),
    ("scale", "resize", "grow", "shrink", "autoscale"),
    ("test", "verify", "validate", "lint", "check"),
    ("build", "compile", "bundle"),
    ("install", "set up", "add dependency"),
    ("log in", "login", "sign in", "authenticate", "auth"),
    ("approve", "sign off", "okay", "lgtm"),
    ("reject", "decline", "deny", "refuse"),
    ("pay", "charge", "bill", "payment", "checkout"),
    ("refund", "reimburse", "money back", "chargeback"),
    # -- things ----------------------------------------------------------------------------
    ("issue", "ticket", "bug", "task", "story", "work item", "card", "todo", "to do", "defect", "epic"),
    ("repository", "repo", "codebase", "project", "source code"),
    ("pull request", "pr", "merge request", "mr", "change request", "code review", "patch"),
    ("branch", "ref", "head"),
    ("commit", "revision", "changeset", "sha", "change"),
    ("diff", "changes", "delta", "compare"),
    ("file", "document", "doc", "attachment", "blob"),
    ("folder", "directory", "dir", "path"),
    ("message", "chat", "text", "dm", "direct message", "post", "conversation", "thread"),
    ("channel", "room", "group chat", "space", "conversation"),
    ("email", "mail", "inbox", "e-mail", "message", "gmail", "outlook"),
    ("calendar", "event", "meeting", "appointment", "invite", "agenda"),
    ("user", "member", "person", "people", "account", "teammate", "employee", "colleague", "profile", "who"),
    ("team", "group", "organization", "org", "workspace", "department"),
    ("contact", "lead", "prospect", "customer", "client"),
    ("customer", "client", "buyer", "account", "subscriber"),
    ("incident", "outage", "alert", "page", "downtime", "problem", "on call", "oncall"),
    ("on call", "oncall", "on-call", "schedule", "rota", "rotation", "shift", "duty"),
    ("database", "db", "sql", "table", "schema", "datastore", "postgres", "mysql", "sqlite"),
    ("table", "collection", "schema", "relation"),
    ("row", "record", "document", "entry", "item"),
    ("query", "sql", "select", "statement"),
    ("index", "indexes", "key"),
    ("deployment", "release", "rollout", "version", "build"),
    ("pipeline", "workflow", "ci", "job", "build", "action", "run"),
    ("container", "docker", "image", "pod"),
    ("cluster", "kubernetes", "k8s", "node pool"),
    ("server", "instance", "vm", "virtual machine", "droplet", "machine", "host", "compute", "ec2"),
    ("bucket", "storage", "object storage", "blob", "s3", "space"),
    ("domain", "dns", "record", "zone", "hostname"),
    ("firewall", "security group", "rule", "ip allow list"),
    ("load balancer", "lb", "balancer", "ingress"),
    ("function", "lambda", "worker", "serverless", "cloud function"),
    ("secret", "credential", "password", "token", "api key", "key", "vault"),
    ("certificate", "cert", "tls", "ssl"),
    ("log", "logs", "logging", "event log", "trace", "output"),
    ("metric", "metrics", "graph", "chart", "dashboard", "time series", "monitoring", "stats"),
    ("error", "exception", "crash", "failure", "stack trace", "bug"),
    ("page", "web page", "website", "site", "url", "tab", "link"),
    ("browser", "chrome", "chromium", "web", "playwright", "puppeteer"),
    ("element", "button", "selector", "field", "locator"),
    ("invoice", "bill", "receipt"),
    ("subscription", "plan", "recurring payment", "membership"),
    ("product", "item", "sku", "catalog entry"),
    ("order", "purchase", "sale", "transaction"),
    ("price", "cost", "pricing", "amount", "fee"),
    ("balance", "funds", "account balance"),
    ("spreadsheet", "sheet", "excel", "workbook", "csv"),
    ("note", "notes", "memo", "page", "wiki", "knowledge base", "doc"),
    ("wiki", "confluence", "knowledge base", "docs", "documentation", "space"),
    ("image", "picture", "photo", "screenshot", "png", "jpg"),
    ("video", "recording", "clip", "movie"),
    ("weather", "forecast", "temperature"),
    ("map", "location", "address", "place", "directions", "route", "geocode"),
    ("time", "date", "clock", "timezone", "time zone", "now"),
    ("entity", "node", "object", "concept"),
    ("relation", "relationship", "edge", "link", "connection"),
    ("memory", "knowledge graph", "remember", "recall", "memorize"),
    ("variable", "env", "environment variable", "config", "setting"),
    ("setting", "settings", "config", "configuration", "preference", "option"),
    ("permission", "role", "access", "policy", "privilege", "scope"),
    ("webhook", "hook", "callback", "notification url"),
    ("notification", "alert", "reminder", "notice"),
    ("status", "state", "health", "condition", "progress"),
    ("owner", "maintainer", "author", "creator"),
    ("milestone", "sprint", "iteration", "cycle", "release"),
    ("priority", "urgency", "severity", "importance"),
    ("due date", "deadline", "due"),
    ("label", "tag", "category", "topic"),
    ("release", "version", "tag"),
    ("package", "library", "dependency", "module"),
    ("search engine", "web search", "google", "internet"),
    ("payment", "charge", "transaction", "payout"),
    ("cost", "spend", "usage", "billing", "bill"),
    ("backup", "snapshot", "dump"),
    ("migration", "schema change", "alter table"),
    ("cache", "redis", "key value"),
    ("queue", "topic", "stream", "kafka"),
)


@dataclass(frozen=True)
class Thesaurus:
    """Phrase groups, analysed like the index's text."""

    groups: tuple[tuple[str, ...], ...] = GROUPS

    @cached_property
    def _phrases(self) -> Mapping[tuple[str, ...], frozenset[tuple[str, ...]]]:
        """Each analysed phrase -> the analysed phrases of every group it is in."""
        related: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
        for group in self.groups:
            analysed = {tuple(terms(p)) for p in group} - {()}
            for phrase in analysed:
                related.setdefault(phrase, set()).update(analysed - {phrase})
        return {phrase: frozenset(others) for phrase, others in related.items()}

    @cached_property
    def _longest(self) -> int:
        return max((len(p) for p in self._phrases), default=1)

    def standing_in(self, query_terms: list[str]) -> dict[tuple[str, ...], frozenset[str]]:
        """The phrases related to ``query_terms`` (less the terms the query holds already), each
        with the query's terms it stands in for (those of the phrases that brought it)."""
        present = set(query_terms)
        found: dict[tuple[str, ...], set[str]] = {}
        for phrase in _phrases_in(query_terms, self._longest):
            for other in self._phrases.get(phrase, ()):
                missing = tuple(t for t in other if t not in present)
                if missing:
                    found.setdefault(missing, set()).update(phrase)
        return {other: frozenset(sources) for other, sources in found.items()}


def _phrases_in(query_terms: list[str], longest: int) -> Iterable[tuple[str, ...]]:
    for start in range(len(query_terms)):
        for length in range(1, longest + 1):
            if start + length <= len(query_terms):
                yield tuple(query_terms[start : start + length])
