-- Runs once, as the postgres superuser, when the PostgreSQL volume is first created (the image's
-- docker-entrypoint-initdb.d, through psql: the \getenv lines read the services' passwords from
-- the container's environment, set in docker-compose.yml from .env).
--
-- One role per service, each owning its own database and nothing else: a leaked hub password
-- does not open the ledger, a leaked billing password does not open the hub's tokens, and
-- neither is the superuser (whose password only the operator uses).
\set ON_ERROR_STOP on
\getenv hub_password GPULAB_HUB_DB_PASSWORD
\getenv billing_password GPULAB_BILLING_DB_PASSWORD

-- NOSUPERUSER NOCREATEDB NOCREATEROLE are the defaults; spelled out because they are the point.
CREATE ROLE gpulab_hub LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'hub_password';
CREATE ROLE gpulab_billing LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'billing_password';

-- An owner keeps CONNECT (and, from PostgreSQL 15, the public schema through pg_database_owner)
-- after PUBLIC loses it, so each role connects to its own database only.
CREATE DATABASE jupyterhub OWNER gpulab_hub;
CREATE DATABASE billing OWNER gpulab_billing;
REVOKE CONNECT, TEMPORARY ON DATABASE jupyterhub FROM PUBLIC;
REVOKE CONNECT, TEMPORARY ON DATABASE billing FROM PUBLIC;
-- The default database holds nothing of theirs either.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;
