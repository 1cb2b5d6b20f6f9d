"""``GET /api/skills``: the skill cards bundled with Fleet."""

from __future__ import annotations

from fastapi import APIRouter

from fleet_api.routes._docs import errors
from fleet_api.schemas import Skill, SkillList
from fleet_kernel.errors import NotFoundError
from fleet_kernel.skills import get_skill, load_skills

router = APIRouter(tags=["skills"])


@router.get("/skills", response_model=SkillList, responses=errors())
async def list_skills() -> SkillList:
    return SkillList(skills=[Skill.model_validate(s.to_dict()) for s in load_skills()])


@router.get("/skills/{name}", response_model=Skill, responses=errors(404))
async def read_skill(name: str) -> Skill:
    skill = get_skill(name)
    if skill is None:
        raise NotFoundError(f"no skill {name[:80]!r}; GET /api/skills lists them")
    return Skill.model_validate(skill.to_dict())
