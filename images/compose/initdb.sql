-- Runs once, when the PostgreSQL volume is first created: the billing service's database lives
-- next to the hub's (POSTGRES_DB creates "jupyterhub").
CREATE DATABASE billing;
