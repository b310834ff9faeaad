"""The tool index: analysis, ranking, calibrated scores, filters and per-upstream updates."""

from __future__ import annotations

from agent_gateway.search.index import Document, ToolIndex
from agent_gateway.search.text import terms


def tracker(upstream: str = "tracker") -> list[Document]:
    return [
        Document(
            f"{upstream}__create_issue",
            upstream,
            "create_issue",
            description="Create a new issue in a project",
        ),
        Document(
            f"{upstream}__list_issues", upstream, "list_issues", description="List the issues of a project"
        ),
        Document(
            f"{upstream}__getMergeRequest",
            upstream,
            "getMergeRequest",
            description="Get one merge request with its diff",
            params="project_id merge_request_iid",
        ),
        Document(f"{upstream}__delete_branch", upstream, "delete_branch", description="Delete a git branch"),
    ]


def chat() -> list[Document]:
    return [
        Document("chat__post_message", "chat", "post_message", description="Post a message to a channel"),
        Document("chat__list_channels", "chat", "list_channels", description="List the workspace's channels"),
    ]


def index_of(*parts: tuple[str, list[Document]]) -> ToolIndex:
    index = ToolIndex()
    for upstream, documents in parts:
        index.replace(upstream, documents)
    return index


def keys(index: ToolIndex, query: str, limit: int = 3, **options: object) -> list[str]:
    return [h.key for h in index.search(query, limit=limit, **options).hits]  # type: ignore[arg-type]


def test_identifiers_are_split_into_words_and_stemmed_alike() -> None:
    assert terms("getMergeRequest") == terms("get merge requests") == ["get", "merg", "request"]
    assert terms("list_issues") == terms("listing the issue") == ["list", "issu"]
    assert "github" in terms("GitHub")
    assert "hub" in terms("GitHub")


def test_the_tool_whose_name_says_it_ranks_first() -> None:
    index = index_of(("tracker", tracker()), ("chat", chat()))
    assert keys(index, "create an issue")[0] == "tracker__create_issue"
    assert keys(index, "merge request diff")[0] == "tracker__getMergeRequest"
    assert keys(index, "post a message")[0] == "chat__post_message"


def test_a_request_in_other_words_finds_the_tool_through_the_thesaurus() -> None:
    index = index_of(("tracker", tracker()), ("chat", chat()))
    assert keys(index, "open a new ticket")[0] == "tracker__create_issue"
    assert keys(index, "remove the feature branch")[0] == "tracker__delete_branch"
    assert keys(index, "show me that PR")[0] == "tracker__getMergeRequest"


def test_scores_tell_a_strong_match_from_a_weak_one() -> None:
    index = index_of(("tracker", tracker()), ("chat", chat()))
    strong = index.search("create issue", limit=1).hits[0]
    weak = index.search("create a spreadsheet chart from the quarterly invoices", limit=1).hits
    assert 0.5 < strong.score <= 1.0
    assert all(hit.score < 0.25 for hit in weak)
    assert index.search("zzyzx frobnicate", limit=5).hits == []


def test_filters_keep_only_the_upstream_asked_for_and_what_the_asker_may_call() -> None:
    index = index_of(("tracker", tracker()), ("other", tracker("other")))
    assert set(keys(index, "create issue", limit=10)) >= {"tracker__create_issue", "other__create_issue"}
    assert keys(index, "create issue", limit=10, upstream="other")[0] == "other__create_issue"
    assert all(k.startswith("other__") for k in keys(index, "issue", limit=10, upstream="other"))
    hidden = keys(index, "create issue", limit=10, accept=lambda name: name != "tracker__create_issue")
    assert "tracker__create_issue" not in hidden
    assert "other__create_issue" in hidden


def test_total_counts_every_match_not_just_the_page() -> None:
    index = index_of(("tracker", tracker()), ("other", tracker("other")))
    results = index.search("issue", limit=1)
    assert len(results.hits) == 1
    assert results.total == 4  # create_issue and list_issues on both trackers
    assert index.search("issue", limit=1, accept=lambda name: name.startswith("other__")).total == 2
    # No tool says "ticket": the rows its expansion (issue) ranked count, and each only once.
    assert index.search("ticket", limit=1).total == 4
    assert index.search("issue ticket", limit=1).total == 4
    # The expansion of "create" (new) ranks the two create_issue rows, matched already.
    assert index.search("create issue", limit=1).total == 4


def test_one_upstream_is_replaced_without_touching_the_others() -> None:
    index = index_of(("tracker", tracker()), ("chat", chat()))
    index.replace("chat", [Document("chat__send_email", "chat", "send_email", description="Send an email")])
    assert "chat__post_message" not in keys(index, "post message", limit=10)
    assert keys(index, "send an email")[0] == "chat__send_email"
    assert keys(index, "create issue")[0] == "tracker__create_issue"
    index.remove("tracker")
    assert keys(index, "create issue", limit=10) == []
    assert len(index) == 1
