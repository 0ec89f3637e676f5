"""/v1/triggers: S3 object events that start runs, and the audit trail of every event."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from services.common.messages import shown
from services.coordinator.api.deps import CallerDep, TenantsDep, bearer_token, current_caller
from services.coordinator.ops.tenants import Caller
from services.coordinator.triggers import signature
from services.coordinator.triggers.audit import TriggerOutcome
from services.coordinator.triggers.dispatch import Triggers
from services.coordinator.triggers.events import UnknownEvent, parse_body
from services.coordinator.triggers.settings import TriggerSettings

router = APIRouter(prefix="/v1/triggers", tags=["triggers"])
_bearer = HTTPBearer(auto_error=False)


class TriggerReply(BaseModel):
    detail: str = Field("", description="The reasons of the rejected events ('' when none was).")
    outcomes: list[TriggerOutcome] = Field(..., description="What each event in the body did.")


class TriggerEventList(BaseModel):
    events: list[TriggerOutcome] = Field(..., description="Newest first.")


def get_triggers(request: Request) -> Triggers:
    return request.app.state.triggers  # type: ignore[no-any-return]


def get_trigger_settings(request: Request) -> TriggerSettings:
    return request.app.state.trigger_settings  # type: ignore[no-any-return]


TriggersDep = Annotated[Triggers, Depends(get_triggers)]


@dataclass(frozen=True)
class AuthorizedEvent:
    body: bytes
    tenant: str | None  # a member token's tenant: only its rules apply; None: every rule


async def authorized_body(
    request: Request, tenants: TenantsDep,
    trigger_settings: Annotated[TriggerSettings, Depends(get_trigger_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AuthorizedEvent:
    """The raw body, once the request carries an API bearer token or a valid X-MMRL-Signature (open
    only when neither a token nor a secret is configured). A member token may start only its
    tenant's rules; an admin token and a signature (the deployment's own forwarder) any rule."""
    body = await request.body()
    secret = trigger_settings.hmac_secret
    given = bearer_token(credentials)
    caller: Caller | None = tenants.caller(given) if given or tenants.open else None
    if caller is not None and (given or not secret):
        return AuthorizedEvent(body, None if caller.admin else caller.tenant)
    header = request.headers.get(signature.HEADER, "")
    if secret and header:
        why = signature.verify(secret, header, body, trigger_settings.signature_tolerance_s)
        if not why:
            return AuthorizedEvent(body, None)
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, why)
    raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                        f"send Authorization: Bearer <API token>{' or ' + signature.HEADER if secret else ''}",
                        headers={"WWW-Authenticate": "Bearer"})


@router.post("/s3", response_model=TriggerReply, responses={
    201: {"description": "A run was queued (it starts when a learner pool is free)."},
    400: {"description": "Not an S3 object-created event."}, 401: {"description": "No valid token or signature."},
    422: {"description": "No rule matches, or the run config is invalid."},
    429: {"description": "The rule's tenant has its max_queued runs queued."},
    502: {"description": "The config object could not be read."}})
async def s3_event(authorized: Annotated[AuthorizedEvent, Depends(authorized_body)],
                   triggers: TriggersDep) -> JSONResponse:
    """An EventBridge 'Object Created' event, an S3 event notification, or one wrapped by SNS: each
    new object queues what the first matching rule says, once per object version."""
    body = authorized.body
    try:
        parsed: Any = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        outcomes = [await triggers.reject(None, 400, "the body is not JSON", body=shown(body.decode(errors="replace"), 500))]
    else:
        try:
            events, note = parse_body(parsed)
        except UnknownEvent as exc:
            outcomes = [await triggers.reject(None, 400, str(exc), body=shown(json.dumps(parsed), 500))]
        else:
            outcomes = [await triggers.object_created(event, authorized.tenant) for event in events]
            if not events:
                outcomes = [await triggers.log.add(TriggerOutcome(outcome="ignored", status_code=200, reason=note))]
    rejected = [o for o in outcomes if o.outcome == "rejected"]
    code = rejected[0].status_code if rejected else 201 if any(o.outcome == "started" for o in outcomes) else 200
    reply = TriggerReply(detail="; ".join(o.reason for o in rejected), outcomes=outcomes)
    return JSONResponse(reply.model_dump(mode="json"), status_code=code)


@router.get("/events", response_model=TriggerEventList, dependencies=[Depends(current_caller)])
async def trigger_events(
    triggers: TriggersDep,
    caller: CallerDep,
    outcome: Annotated[str | None, Query(description="started, duplicate, rejected or ignored")] = None,
    source: Annotated[str | None, Query(description="eventbridge, s3-notification, sns or inbox")] = None,
    key: Annotated[str | None, Query(description="the object key (inbox: the file name)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> TriggerEventList:
    """Every event given to the triggers, accepted or not, newest first; a member sees the events of
    its tenant's rules only."""
    tenant = None if caller.admin else caller.tenant
    return TriggerEventList(events=await triggers.log.newest(limit, outcome, source, key, tenant))
