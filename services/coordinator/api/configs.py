"""/v1/configs: reads a run config file's text (YAML or TOML) into a validated run config, so that
a client without a YAML parser (the browser console) can start a run from a config file."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.config_files import parse_config_text
from services.coordinator.config import RunConfig

router = APIRouter(prefix="/v1/configs", tags=["configs"])


class ConfigText(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(..., max_length=1_000_000, description="The config file's contents.")
    format: Literal["yaml", "toml"] = Field("yaml", description="The file's format.")


class ParsedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: RunConfig = Field(..., description="The run config, validated, with every default filled in.")


@router.post("/parse", response_model=ParsedConfig)
async def parse_config(body: ConfigText) -> ParsedConfig:
    """The run config the text describes; a 422 that says what is wrong otherwise."""
    try:
        data = parse_config_text(body.text, "the config.toml" if body.format == "toml" else "the config")
        return ParsedConfig(config=RunConfig.model_validate(data))
    except ValidationError as exc:
        raise HTTPException(422,
                            [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
