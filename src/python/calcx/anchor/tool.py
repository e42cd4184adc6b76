"""The calculator as a verl tool (`BaseTool`), for verl's ToolAgentLoop.

verl's ToolAgentLoop renders each tool's `tool_schema.model_dump(...)` into the prompt through the
chat template. verl's schema models keep only the keys they declare, so the MCP schema's `title`
and AutoGen's `additionalProperties` would be dropped and keys reordered: `ExactToolSchema` is
verl's schema type whose dump is the agent's `tools` entry, unchanged. Every answer, the
calculator's refusals included, is the MCP server's own text (calcx.agent.calculator_inprocess),
returned as the tool's reply rather than raised (verl would put its own error text in its place).

Imports verl: load it only where verl is installed.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import PrivateAttr
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from calcx.agent.calculator_inprocess import calculator_tool_entry, call


class ExactToolSchema(OpenAIFunctionToolSchema):
    """An OpenAIFunctionToolSchema that dumps as the entry it was made from."""

    _entry: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(cls, entry: dict[str, Any]) -> ExactToolSchema:
        schema = cls.model_validate(entry)
        schema._entry = copy.deepcopy(entry)
        return schema

    def model_dump(self, **_: Any) -> dict[str, Any]:  # type: ignore[override]
        return copy.deepcopy(self._entry)


class CalculatorTool(BaseTool):
    """The MCP calculator's `calculate`, in-process; stateless (no per-trajectory instance)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        if tool_schema is not None:
            raise ValueError(
                "the calculator's schema is mcp_server_calculator's own: leave `tool_schema` out of " "the tool config"
            )
        # BaseTool falls back on get_openai_tool_schema() when handed none; hand it over directly.
        super().__init__(config, self.get_openai_tool_schema())

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return ExactToolSchema.of(calculator_tool_entry())

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        text, is_error = await call(self.name, parameters)
        return ToolResponse(text=text), 0.0, {"is_error": is_error}
