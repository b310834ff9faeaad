"""The tool index: analysis, ranking, calibrated scores, filters and per-upstream updates."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from agent_gateway.search.index import Document, ToolIndex
from agent_gateway.search.text import terms
from agent_gateway.search.thesaurus import Thesaurus


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
    # No word in common with create_issue's text ("new" is in its description): only the
    # thesaurus (ticket -> issue) finds it.
    assert keys(index, "file a ticket")[0] == "tracker__create_issue"
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


def test_fts5_scores_a_query_as_the_sum_of_its_terms_scores() -> None:
    """The index adds up each term's BM25 from FTS5 instead of ranking every matching row per
    search; that holds only while FTS5's bm25() is a sum over the query's phrases."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(name, description)")
    db.execute("INSERT INTO t(t, rank) VALUES ('rank', 'bm25(6.0, 2.0)')")
    rows = [
        ("create issue", "create a new issue in a project"),
        ("list issue", "list the issue of a project project"),
        ("merge request", "get one merge request with its diff"),
        ("delete branch", "delete a git branch of a project"),
    ]
    db.executemany("INSERT INTO t(name, description) VALUES (?, ?)", rows)

    def scores(match: str) -> dict[int, float]:
        return dict(db.execute("SELECT rowid, -rank FROM t WHERE t MATCH ?", (match,)).fetchall())

    together = scores('"issue" OR "project" OR "branch"')
    apart = [scores(f'"{term}"') for term in ("issue", "project", "branch")]
    assert set(together) == {1, 2, 4}
    for rowid, score in together.items():
        assert score == pytest.approx(sum(s.get(rowid, 0.0) for s in apart), rel=1e-9)


def test_searches_after_a_change_rank_as_a_fresh_index_does() -> None:
    """Each term's scores are kept between searches; a change must drop them (IDF and lengths move)."""
    index = index_of(("tracker", tracker()), ("chat", chat()))
    for query in ("create issue", "list channels", "project"):
        index.search(query, limit=5)
    index.replace("chat", [*chat(), *tracker("chat")])
    fresh = index_of(("tracker", tracker()), ("chat", [*chat(), *tracker("chat")]))
    for query in ("create issue", "list channels", "project", "open a ticket"):
        assert index.search(query, limit=5) == fresh.search(query, limit=5)
    index.remove("chat")
    assert index.search("project", limit=5) == index_of(("tracker", tracker())).search("project", limit=5)
    index.replace("other", tracker("other"))  # an upstream the index never held
    fresh = index_of(("tracker", tracker()), ("other", tracker("other")))
    assert index.search("project", limit=5) == fresh.search("project", limit=5)


def test_a_query_counts_its_first_distinct_terms_only() -> None:
    index = index_of(("tracker", tracker()), ("chat", chat()))
    filler = " ".join(f"word{n}x" for n in range(500))
    assert keys(index, f"post a message {filler}")[0] == "chat__post_message"
    assert keys(index, f"{filler} post a message") == []  # past the first MOST_TERMS terms
    repeated = " ".join(["deploy"] * 500)  # one distinct term, however often
    assert keys(index, f"{repeated} post a message")[0] == "chat__post_message"
    log = " ".join(["the"] * 2_000)  # stop words: no term at all, but past MOST_CHARS
    assert keys(index, f"{log} post a message") == []


def test_a_phrase_of_the_request_is_expanded_in_the_order_it_was_written() -> None:
    """ "roll back" is a thesaurus phrase (undo, revert); its words sorted ("back roll") are not."""
    edits = [
        Document("docs__undo_edit", "docs", "undo_edit", description="Undo the last edit"),
        Document("docs__list_edits", "docs", "list_edits", description="List the edits"),
    ]
    assert keys(index_of(("docs", edits)), "roll back")[0] == "docs__undo_edit"


def listing(*tools: Document) -> ToolIndex:
    """``tools`` among others that list and get things: "list" is common, so worth little."""
    filler = [
        *(Document(f"c__list_{n}", "c", f"list_{n}", description=f"List the {n}") for n in range(15)),
        *(Document(f"c__get_{n}", "c", f"get_{n}", description=f"Get one of the {n}") for n in range(25)),
    ]
    return index_of(("c", [*tools, *filler]))


def test_a_rare_synonym_does_not_outweigh_the_requests_own_word() -> None:
    """ "enumerate" is rarer than "list": at its own IDF it put a tool that says only it above
    the one that says the request's word."""
    index = listing(
        Document("c__subscriptions_enumerated", "c", "subscriptions", description="Enumerate subscriptions"),
        Document("c__subscriptions_listed", "c", "subscription", description="List subscriptions"),
    )
    assert keys(index, "list subscriptions")[0] == "c__subscriptions_listed"


def test_several_synonyms_of_one_word_count_as_one() -> None:
    """ "bug", "story", "task" and "epic" all stand in for "ticket", which no tool says:
    summed, four of them in one description outweighed one in a shorter one."""
    index = listing(
        Document("c__tool_b", "c", "tool_b", description="Bugs, stories, tasks and epics"),
        Document("c__tool_a", "c", "tool_a", description="Issues"),
    )
    assert keys(index, "tickets")[0] == "c__tool_a"


def test_a_phrase_stands_in_with_all_its_words() -> None:
    """ "PR" stands in for "merge request": both words of it count, not the better one."""
    tools = [
        Document("r__tool_two", "r", "tool_two", description="Merge branches"),
        Document("r__tool_one", "r", "tool_one", description="Get a merge request"),
        Document("r__tool_three", "r", "tool_three", description="Request log"),
        *[
            Document(f"r__list_{n}", "r", f"list_{n}", description=f"List {n}")
            for n in ("tags", "jobs", "runs")
        ],
    ]
    assert keys(index_of(("r", tools)), "that PR")[0] == "r__tool_one"
    assert Thesaurus().standing_in(terms("that PR"))[("merg", "request")] == frozenset({"pr"})


def _instructed(documents: list[Document], instructions: str) -> list[Document]:
    return [replace(d, instructions=instructions) for d in documents]


def test_an_upstreams_instructions_leave_its_tools_scores_as_they_were_where_they_hold_no_word_asked() -> (
    None
):
    # They were a field of each of its tools: 300 words of them made each tool's text long
    # for BM25 (a long text scores less), and tools of an upstream that says much fell
    # behind another's on the same words.
    words = " ".join(f"word{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(300))
    plain = index_of(("tracker", tracker()), ("chat", chat()))
    said = index_of(("tracker", _instructed(tracker(), words)), ("chat", chat()))
    for query in ("list the issues of a project", "post a message", "delete a branch", "merge request"):
        assert said.search(query, limit=6).hits == plain.search(query, limit=6).hits


def test_instructions_naming_an_upstreams_tools_do_not_make_each_of_them_cover_the_request() -> None:
    # Each tool held its upstream's instructions as its own words, so instructions listing
    # the tools ("create issues, list issues, delete branches ...") made every sibling cover
    # the request as fully as the tool it asks for: 0.726 -> 0.598 recall@5 on the benchmark.
    listed = "This server can create issues, list issues, get merge requests and delete git branches."
    plain = index_of(("tracker", tracker()), ("chat", chat()))
    said = index_of(("tracker", _instructed(tracker(), listed)), ("chat", chat()))
    for query in ("delete a git branch", "create an issue", "list the issues"):
        assert keys(said, query, limit=4) == keys(plain, query, limit=4)


def test_instructions_still_tell_one_upstreams_tool_from_anothers() -> None:
    records = [Document("crm__search", "crm", "search", description="Search the records")]
    logs = [Document("logs__search", "logs", "search", description="Search the records")]
    index = index_of(
        ("logs", logs), ("crm", _instructed(records, "Customer relationships: contacts, deals and accounts."))
    )
    assert keys(index, "search the customer deals")[0] == "crm__search"
    assert keys(index, "search the account contacts")[0] == "crm__search"
