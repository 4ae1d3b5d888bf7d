-- The runtime role: it logs in and gets DML grants from the migrations, nothing else.
CREATE ROLE orquestador_runtime LOGIN PASSWORD 'runtime';
