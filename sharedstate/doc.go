// Package sharedstate holds the pure parts of Concord's shared-state synchronization: the registry of
// named tensors a peer keeps bit-identical with its group, the deterministic parallel content hash, the
// binary encoding of a peer's digest, the popularity election the master runs over all digests, the byte
// ranges an outlier fetches from several donors, and the step a recovery resumes at. Nothing here opens a
// socket, starts a long-lived goroutine or reads a clock (except the two Measure functions, which exist
// to time the hash on the machine they run on); the master and the peer-to-peer transfer build on it.
//
// # Registry
//
// A State is a revision plus Entries keyed by name, never by position: two peers that register the
// same tensors in a different order hold the same state. Every dtype has its real size (f16 and bf16
// entries are two bytes an element), and an entry's Data must be a whole number of elements. An entry
// marked MayDiffer is excluded from the vote, but a peer that is behind still receives it.
//
// # Hash format
//
// Hash cuts the data into blocks of BlockSize bytes (the last one may be shorter) and hashes each block
// with xxh3 (seed 0). The leaf hashes are combined level by level: neighbours 2k and 2k+1 become
// xxh3 with seed NodeSeed of their two 64-bit values written little-endian one after the other, and
// an odd last node moves up a level unchanged. The result is xxh3 with seed RootSeed of the top value
// (0 when there is no block) and the data length, both little-endian. Only the leaves are computed in
// parallel and the tree is fixed by the length alone, so the hash is the same for any worker count, on
// any platform. The format is pinned by a known-answer test.
//
// # Election
//
// Elect takes one Candidate (peer id, strategy, digest) per peer and the Prior accepted by the
// previous sync, and returns a Plan. Its rules:
//
//   - Entry set. Every candidate must list the same names with the same dtype, element count and
//     MayDiffer flag. Otherwise Elect fails with a *MismatchError that names each differing entry and
//     which peers hold which variant of it. A newcomer therefore registers every entry, MayDiffer ones
//     included, before it syncs.
//   - Voters. Peers with strategy EnforcePopular or SendOnly vote; ReceiveOnly peers never vote and
//     never donate.
//   - Revision, fresh run (prior nil). The elected revision is the one most voters hold; a tie goes to
//     the higher revision.
//   - Revision with a prior p. A voter whose revision is above p+1 is rejected with ErrRevision. If a
//     voter holds p+1, p+1 is elected: the normal step, one increment per sync. Otherwise, if a voter
//     holds p, p is elected and the sync is a resumption: the content must be exactly the remembered
//     one, every non-MayDiffer entry is elected with the Prior's hash, and Elect fails with
//     ErrResumeMismatch when the entry set differs from the Prior's or no voter at p holds an entry's
//     remembered hash. This covers both a no-op sync and a group whose peers all left and came back
//     from a checkpoint. If no voter holds p or p+1, Elect fails with ErrResumeMismatch.
//   - Content. The state is elected whole, never entry by entry: only voters at the elected revision
//     count, each votes for the list of hashes of all its entries that are not MayDiffer, and the list
//     most of them hold wins; a tie goes to the list with the smallest hashes, compared entry by entry
//     in name order. Different content always has different hash values here, so this order is
//     total, and every peer ends with a state that some voter held. (An election per entry could
//     combine one peer's parameters with another's optimizer state.)
//   - SendOnly. A SendOnly peer asserts that its state is right. If it is not at the elected revision
//     or its hash loses for any entry, it is rejected with ErrSendOnlyLost, its vote is withdrawn and the
//     election is run again without it, until every remaining SendOnly peer agrees with the result. A
//     rejected peer is neither a donor nor a receiver.
//   - Donors. The donors of an entry are the remaining voters at the elected revision that hold the
//     elected hash. When there is no voter left, Elect fails with ErrNoDonor.
//   - Outliers. A peer that is not rejected fetches only the non-MayDiffer entries whose hash differs
//     from the elected one. A peer that is behind (its revision is not the elected one, or it is
//     ReceiveOnly) also takes the MayDiffer entries of one voter that holds the whole elected state
//     (any voter at the elected revision when none does, which only a resumption allows): the one
//     whose MayDiffer entries differ from its own by the fewest bytes, then the least loaded, then the
//     smallest peer id. It fetches those that differ from that single donor, because holders may
//     legitimately differ and their bytes must not be mixed. Peers at the elected revision keep their
//     own MayDiffer entries.
//   - Spreading. Fetches are assigned in order of peer id, then entry name. Each fetch lists all its
//     donors, the least loaded first (bytes assigned so far as first donor, then peer id), and the first
//     donor's load grows by the entry's size. SplitRanges cuts a large entry into ranges over those
//     donors.
//   - Determinism. Candidates are sorted by peer id and digests by entry name before anything is
//     decided, so the same candidates in any order give the same Plan.
//
// Concord does not copy PCCL's rule that EnforcePopular cannot be mixed with the other strategies:
// every mix is allowed, and each strategy keeps its meaning.
//
// # Recovery step
//
// ResumeStep applies the rule of checkpoint-free recovery within one step: a peer that failed before the
// optimizer step of step i resumes at i, one that failed in or after it resumes at i+1 (see ResumeStep).
package sharedstate
