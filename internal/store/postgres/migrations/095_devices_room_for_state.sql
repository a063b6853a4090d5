-- A device's row is registered without a state and its first push adds
-- one (the emulator's: 750 bytes; a row grows from about 190 to 950).
-- With fillfactor 70 a page of registered rows had room for two or three
-- of those: every other first push moved its row to a new page and wrote
-- both indexes (non-HOT). Fillfactor 15 leaves a page of registered rows
-- room for their first states and, after them, about 30 % free for HOT
-- updates as 70 did. It applies to pages filled from now on.
ALTER TABLE devices SET (fillfactor = 15);
