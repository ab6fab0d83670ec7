"""The service's assembly: one builder per feature, each returning its collaborators and a `Part`
(its routes and what runs while the process does). `gateway.app` calls them in order."""
