-- A chat history as SpecDesk wrote it before branches (schema user_version 1), made with
-- that version's History(): chats with interleaved messages, one chat without messages,
-- a regenerated reply (deleted, its id taken by the next). tests/test_history.py migrates it.
PRAGMA user_version=1;
PRAGMA application_id=1397769283;
BEGIN TRANSACTION;
CREATE TABLE chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
INSERT INTO "chats" VALUES(1,'parse args',1.79617177227974486345e+09,1.79617177228055214881e+09);
INSERT INTO "chats" VALUES(2,'empty chat',1.79617177227982950217e+09,1.79617177227982950217e+09);
INSERT INTO "chats" VALUES(3,'unicode ✓ «quotes» ''single''',1.79617177227987074856e+09,1.79617177228062701224e+09);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
INSERT INTO "messages" VALUES(1,1,'user','def parse_args(argv):','{}',1.79617177227991366389e+09);
INSERT INTO "messages" VALUES(2,3,'user','Ünïcödé and emoji 🚀; a quote '' and "double"','{}',1.79617177228006410592e+09);
INSERT INTO "messages" VALUES(3,1,'assistant','    return argv','{"draft_spans": [[4, true], [11, false]], "tok_s": 41.5}',1.79617177228030824656e+09);
INSERT INTO "messages" VALUES(4,3,'assistant','Line one
Line two
	tabbed','{}',1.79617177228040623667e+09);
INSERT INTO "messages" VALUES(5,1,'user','Now with **argparse**, please.

```python
import argparse
```','{}',1.79617177228047752383e+09);
INSERT INTO "messages" VALUES(6,1,'assistant','| flag | meaning |
|---|---|
| -v | verbose |','{"draft_spans": [[10, false]]}',1.79617177228055214881e+09);
INSERT INTO "messages" VALUES(7,3,'user','','{}',1.79617177228062701224e+09);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
COMMIT;
