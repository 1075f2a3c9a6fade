"""The torture ledger check after an operator's salvage (`mqstore recover --salvage`): every
acknowledged message survives except the one whose record the salvage accepted as damaged,
which is counted apart (`lost_to_salvage`, chosen), never as a silent loss.
"""

from __future__ import annotations

import random

from engine.config import StoreConfig
from engine.formats.record import BODY_OFFSET
from engine.recovery.recover import RecoveryMode
from engine.store import MessageStore
from tests.faults.fault_harness import SMALL_CONFIG, fill_store
from tests.helpers import segment_of
from tools.torture.faults import flip_byte
from tools.torture.verify import AcceptedDamage, VerifyState, verify_store

SYNC = StoreConfig(**SMALL_CONFIG)


def test_salvage_loses_exactly_the_damaged_acknowledged_message(tmp_path):
    with MessageStore.open(tmp_path, SYNC) as store:
        entries = fill_store(store, random.Random(3), 60)
    state = VerifyState()
    assert not verify_store(tmp_path, entries, state).problems  # scanned once, as rounds do
    victim = entries[25]
    path, file_pos = segment_of(tmp_path, victim.commit_pos, SYNC.commitlog_file_size)
    flip_byte(path, file_pos + BODY_OFFSET, 0x10)
    with MessageStore.open(tmp_path, SYNC, recovery=RecoveryMode.SALVAGE) as store:
        [span] = store.recovery_report.damage_accepted
        more = fill_store(store, random.Random(4), 5, first=1000)
    assert (span["start_pos"], span["end_pos"]) == (victim.commit_pos, victim.end_pos)
    state.salvages.append(AcceptedDamage(2**62, span["start_pos"], span["end_pos"]))
    state.log.forget_span(span["start_pos"], span["end_pos"])
    report = verify_store(tmp_path, entries + more, state)
    assert not report.problems, report.problems
    assert report.lost_to_salvage == [victim.identity] and report.lost == []
    fresh = verify_store(tmp_path, entries + more, VerifyState(salvages=list(state.salvages)))
    assert not fresh.problems, fresh.problems  # a scan from the start goes on past the span
    assert fresh.lost_to_salvage == [victim.identity]
