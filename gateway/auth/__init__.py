"""Who is calling: API keys and their service, the `Authenticate` stage, principals, model tenancy."""
