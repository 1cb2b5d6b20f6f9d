"""``GET /api/skills`` and ``GET /api/skills/{name}``: the skill cards a turn of this server sees."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from fleet_api.deps import State
from fleet_api.routes._docs import errors
from fleet_api.schemas import Skill, SkillList
from fleet_kernel.errors import NotFoundError
from fleet_kernel.skills import catalogue_for

router = APIRouter(tags=["skills"])


@router.get("/skills", response_model=SkillList, responses=errors())
async def list_skills(state: State) -> SkillList:
    catalogue = await asyncio.to_thread(catalogue_for, state.settings)
    return SkillList(skills=[Skill.model_validate(s.to_dict()) for s in catalogue], warnings=list(catalogue.warnings))


@router.get("/skills/{name}", response_model=Skill, responses=errors(404))
async def read_skill(name: str, state: State) -> Skill:
    catalogue = await asyncio.to_thread(catalogue_for, state.settings)
    skill = catalogue.skills.get(name)
    if skill is None:
        raise NotFoundError(f"no skill {name[:80]!r}; GET /api/skills lists them")
    return Skill.model_validate(skill.to_dict())
