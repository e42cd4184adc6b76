"""A refusal for the model's context is told apart from every other 400, in either wording."""

from __future__ import annotations

import pytest

from calcx.contract.gateway import CONTEXT_LENGTH_EXCEEDED, context_refused
from calcx.stub_llm.app import OVERLONG_ERROR


def test_vllms_wording_and_openais_code_are_a_context_refusal() -> None:
    assert context_refused(400, OVERLONG_ERROR)  # vLLM: the message only, `code` the status
    assert context_refused(400, {"message": "too long", "code": CONTEXT_LENGTH_EXCEEDED})  # OpenAI, the gateway
    engine = "The decoder prompt (length 4100) is longer than the maximum model length of 4096. Make sure that ..."
    assert context_refused(400, {"message": engine, "type": "BadRequestError", "code": 400})  # vLLM's engine


@pytest.mark.parametrize(
    "status, error",
    [
        (400, {"message": "bad request upstream"}),
        (400, {"message": "unknown field logit_bias", "code": "field_not_allowed"}),
        (500, OVERLONG_ERROR),  # only a 400 refuses the request itself
        (400, "maximum context length"),  # not an error object
        (400, None),
    ],
)
def test_other_answers_are_not(status: int, error: object) -> None:
    assert not context_refused(status, error)
