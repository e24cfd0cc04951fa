-- FlowForge schema 25: the lease's epoch becomes a key column, so the fence and the renewal
-- stop blocking each other. Every store move locks the lease row FOR KEY SHARE (store/lease.py)
-- to compare epochs. PostgreSQL lets an UPDATE that changes no key column (a renewal, a
-- release: expires_at only) take the row FOR NO KEY UPDATE, which a KEY SHARE lock does not
-- block; an UPDATE of a key column takes it FOR UPDATE, which waits for every KEY SHARE lock.
-- With epoch in a unique constraint, a takeover (epoch + 1) still waits for the old epoch's
-- moves in flight, while a renewal no longer queues behind a stream of moves: with the old
-- FOR SHARE fence, 50 moves at once kept the row share-locked past the renewal's statement
-- timeout and the leader stopped acting for seconds.
ALTER TABLE flowforge_lease ADD CONSTRAINT flowforge_lease_epoch_key UNIQUE (name, epoch);
