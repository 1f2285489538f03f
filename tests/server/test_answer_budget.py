"""The budget of large answers held for slow readers (`server.answers.AnswerBudget`) at its
edges: what always fits, what fits exactly, and what is counted as refused."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web

from raftlog.node.server.answers import SMALL, AnswerBudget


def test_an_answer_up_to_small_always_fits_and_is_never_held():
    budget = AnswerBudget(limit=SMALL * 4, send_timeout_s=1)
    budget.held = SMALL * 10  # over the limit already
    assert budget.may_take(SMALL) and budget.refused == 0
    resp = web.Response(body=b"x" * SMALL)
    request = cast(Any, None)  # not used: a small answer is returned for aiohttp to send
    assert asyncio.run(budget.send(request, resp)) is resp
    assert budget.held == SMALL * 10


def test_an_answer_that_fills_the_budget_exactly_fits_and_one_byte_more_is_refused():
    budget = AnswerBudget(limit=SMALL * 4, send_timeout_s=1)
    budget.held = SMALL * 2
    assert budget.may_take(SMALL * 2) and budget.refused == 0
    assert not budget.may_take(SMALL * 2 + 1)
    assert budget.refused == 1  # raftlog_answers_refused_total


def test_one_answer_alone_fits_whatever_the_limit():
    budget = AnswerBudget(limit=SMALL, send_timeout_s=1)
    assert budget.may_take(SMALL * 100)  # nothing held: a page larger than the limit is sent
    budget.held = 1
    assert not budget.may_take(SMALL * 100)
