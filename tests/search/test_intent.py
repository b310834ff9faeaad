"""What a request asks done and what a tool does, and the rerank that keeps them together."""

from __future__ import annotations

import pytest

from agent_gateway.search.index import Document, ToolIndex
from agent_gateway.search.intent import conflicts, performed, requested


@pytest.mark.parametrize(
    ("query", "action"),
    [
        ("what's on my calendar tomorrow", "read"),
        ("Which VMs are running?", "read"),
        ("is Jonas online right now", "read"),
        ("show me the open PRs", "read"),
        ("give me the open PRs", "read"),
        ("tell me who is on call", "read"),
        ("send me the latest invoice", "read"),
        ("pods in kube-system?", "read"),
        ("pods in kube-system? then create a ticket", "read"),
        ("k8s events. Which ones are new?", None),  # the question is not the request's lead
        ("add another node pool", "create"),
        ("please file a bug for the login page", "create"),
        ("spin up a small VM", "create"),
        ("can you rename the droplet", "change"),
        ("give PROJ-142 to Maria", None),
        ("Delete the staging branch", "delete"),
        ("get rid of the stale branches", "delete"),
        ("spin down the staging cluster", "delete"),
        ("tell #deploys the rollout is done", "send"),
        ("email the report to finance", "send"),
        ("create a ticket?", "create"),
        ("email search", None),  # a noun phrase: an agent's search, not a request to mail
        ("file upload", None),
        ("new issues this week", None),
        ("k8s events kube-system", None),
        ("the email about the failed deploy", None),
        ("can you?", None),
        ("Zeig mir die Tickets", None),
        ("", None),
    ],
)
def test_a_request_asks_what_its_first_words_say(query: str, action: str | None) -> None:
    assert requested(query) == action


@pytest.mark.parametrize(
    ("name", "action"),
    [
        ("list-calendar-events", "read"),
        ("getMergeRequest", "read"),
        ("doks-create-nodepool", "create"),
        ("TwilioApiV2010--CreateMessage", "create"),
        ("r2_delete_bucket", "delete"),
        ("decline-calendar-event", "change"),
        ("write_query", "change"),
        ("slack_post_message", "send"),
        ("API-post-search", "read"),  # an HTTP method, then what the tool does
        ("API-patch-page", "change"),
        ("manage_task_list", None),
        ("kubectl_rollout", None),
    ],
)
def test_a_tool_does_what_its_names_first_verb_says(name: str, action: str | None) -> None:
    assert performed(name) == action


def test_only_actions_that_cannot_serve_each_other_conflict() -> None:
    assert conflicts("read", "create")
    assert conflicts("create", "read")
    assert conflicts("create", "delete")
    assert conflicts("change", "delete")
    assert not conflicts("create", "change")  # adding a label is an update
    assert not conflicts("delete", "change")  # removing a label is too
    assert not conflicts("read", "read")
    assert not conflicts(None, "delete")
    assert not conflicts("read", None)


def calendar() -> list[Document]:
    verbs = ("decline", "accept", "forward", "create", "delete")
    documents = [
        Document(
            f"cal__{verb}-calendar-event",
            "cal",
            f"{verb}-calendar-event",
            description=f"{verb.capitalize()} an event of the user's calendar",
        )
        for verb in verbs
    ]
    return [
        *documents,
        Document(
            "cal__list-calendar-events",
            "cal",
            "list-calendar-events",
            description="List the events of the user's calendar in a time range",
            params="start end calendar_id",
        ),
    ]


def tracker() -> list[Document]:
    return [
        Document(
            "t__get_bug_report",
            "t",
            "get_bug_report",
            description="Get the bug report of an issue: steps, browser and logs",
        ),
        Document(
            "t__create_issue", "t", "create_issue", description="Create an issue: a bug, a task or a story"
        ),
        Document("t__delete_issue", "t", "delete_issue", description="Delete an issue"),
    ]


def ranked(query: str) -> list[str]:
    index = ToolIndex()
    index.replace("cal", calendar())
    index.replace("t", tracker())
    return [hit.key for hit in index.search(query, limit=3).hits]


def test_a_question_ranks_the_tool_that_reads_above_those_that_write() -> None:
    assert ranked("what's on my calendar tomorrow")[0] == "cal__list-calendar-events"


def test_a_request_to_create_ranks_the_tool_that_creates_first() -> None:
    # "bug" is in the name of the tool that reads one; "file a" asks to create one.
    assert ranked("file a bug: the login button does nothing on Safari")[0] == "t__create_issue"
