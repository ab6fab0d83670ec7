"""Which tenants may use a model, and who manages it (README "Security model").

A model lists its tenants in the config; none listed means every tenant (a shared model). Using a
model needs the key's tenant among them (and the model in the key's own list, if it has one).
Managing a model - releases, canaries, rollback - changes what every tenant of it receives, so it
needs a platform admin (`Principal.all_tenants`) or a model whose only tenant is the caller's.
A model the caller may not use is "not found", so model names do not leak across tenants; a key
is not made for a model its tenant may not use (it would only ever get 404), and the refusal
reads the same for another tenant's model as for one that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.core.principal import Principal
from gateway.errors import ModelNotFound, PermissionDenied


class ModelTenancy:
    def __init__(self, tenants_by_model: Mapping[str, Iterable[str]]) -> None:
        self._tenants = {model: frozenset(tenants) for model, tenants in tenants_by_model.items()}

    @property
    def names(self) -> list[str]:
        return list(self._tenants)

    def known(self, model: str) -> bool:
        return model in self._tenants

    def serves(self, tenant: str, model: str) -> bool:
        """Whether a key of `tenant` (not a platform admin) could use `model` at all."""
        tenants = self._tenants.get(model)
        return tenants is not None and (not tenants or tenant in tenants)

    def may_use(self, principal: Principal, model: str) -> bool:
        tenants = self._tenants.get(model)
        if tenants is None or not principal.may_use(model):
            return False
        return principal.all_tenants or not tenants or principal.tenant in tenants

    def require_use(self, principal: Principal, model: str) -> None:
        if not self.may_use(principal, model):
            raise ModelNotFound(f"The model '{model}' does not exist", param="model")

    def require_manage(self, principal: Principal, model: str) -> None:
        self.require_use(principal, model)
        if principal.all_tenants or self._tenants[model] == {principal.tenant}:
            return
        raise PermissionDenied(
            f"model '{model}' is shared with other tenants: managing its releases needs a platform admin key"
        )
