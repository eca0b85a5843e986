"""Generate the built-in quality-probe sets that are made by rule rather than written by hand.

    .venv/bin/python scripts/make_probe_sets.py          # rewrites the three files below
    .venv/bin/python scripts/make_probe_sets.py --check  # exit 1 if they are out of date

Writes ``benchmarks/quality/sets/{math,json,long-context}.jsonl``: maths word problems whose
answers are computed here, JSON extraction tasks whose expected fields come from the same
records that wrote the text, and long documents of filler with one planted fact. A fixed seed
keeps the output byte-identical between runs, so a change to a set shows up as a diff. The
hand-written sets (knowledge-en, knowledge-ko, format) are edited as JSONL directly.
"""

# ruff: noqa: E501 - the probe texts are data; wrapping them mid-sentence would hide them

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

SETS = Path(__file__).resolve().parent.parent / "benchmarks" / "quality" / "sets"
SEED = 20260419


def _item(id, category, language, text, answer, reference, wrong, max_tokens, **extra):
    out = {
        "id": id,
        "category": category,
        "language": language,
        "messages": [{"role": "user", "content": text}],
        "answer": answer,
        "reference": reference,
        "wrong": wrong,
        "max_tokens": max_tokens,
    }
    out.update(extra)
    return out


def _n(x: float) -> str:
    """A number as people write it: thousands separators, no trailing .0."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}".rstrip("0")


# --- maths word problems: (English template, Korean template, answer) from random numbers ---


def _shop(r):
    n, p, q = r.randint(3, 9), r.randint(2, 15), r.randint(1, 9)
    en = f"A notebook costs {p} dollars and a pen costs {q} dollars. Mia buys {n} notebooks and one pen. How many dollars does she spend?"
    pk, qk = p * 100, q * 100
    ko = f"공책 한 권은 {_n(pk)}원, 펜 한 자루는 {_n(qk)}원입니다. 지아가 공책 {n}권과 펜 한 자루를 샀습니다. 모두 몇 원입니까?"
    return en, n * p + q, ko, n * pk + qk


def _speed(r):
    v, t = r.choice([40, 50, 60, 72, 80, 90]), r.randint(2, 7)
    en = f"A train travels at a constant {v} km per hour for {t} hours. How many kilometres does it travel?"
    ko = f"기차가 시속 {v}km로 {t}시간 동안 일정하게 달렸습니다. 기차가 달린 거리는 몇 km입니까?"
    return en, v * t, ko, v * t


def _discount(r):
    price, d = r.randrange(40, 400, 20), r.choice([10, 20, 25, 50])
    after = price * (100 - d) / 100
    en = f"A jacket costs {price} dollars. The shop gives {d}% off. What is the price after the discount, in dollars?"
    pk = price * 1000
    ko = f"{_n(pk)}원짜리 가방을 {d}% 할인해서 판매합니다. 할인된 가격은 몇 원입니까?"
    return en, after, ko, pk * (100 - d) / 100


def _share(r):
    kids, each = r.randint(3, 9), r.randint(4, 12)
    total = kids * each
    en = f"{total} stickers are shared equally among {kids} children. How many stickers does each child get?"
    ko = f"사탕 {total}개를 어린이 {kids}명에게 똑같이 나누어 주려고 합니다. 한 명이 몇 개씩 받습니까?"
    return en, each, ko, each


def _age(r):
    a, k, y = r.randint(5, 12), r.randint(3, 4), r.randint(2, 9)
    en = f"Leo is {a} years old. His grandmother is {k} times as old as Leo. How old will his grandmother be in {y} years?"
    ko = f"서준이는 {a}살이고 할머니의 나이는 서준이 나이의 {k}배입니다. {y}년 뒤 할머니는 몇 살이 됩니까?"
    return en, k * a + y, ko, k * a + y


def _garden(r):
    w, length = r.randint(3, 15), r.randint(16, 40)
    en = f"A rectangular garden is {w} metres wide and {length} metres long. What is its area in square metres?"
    ko = f"가로가 {w}m, 세로가 {length}m인 직사각형 텃밭이 있습니다. 텃밭의 넓이는 몇 제곱미터입니까?"
    return en, w * length, ko, w * length


def _average(r):
    a, b = r.randint(60, 95), r.randint(60, 95)
    c = r.randint(60, 95)
    c += (3 - (a + b + c) % 3) % 3  # a whole-number mean, so the key needs no rounding rule
    en = f"Sofia scored {a}, {b} and {c} points on three tests. What is her average score?"
    ko = f"민서는 세 번의 시험에서 {a}점, {b}점, {c}점을 받았습니다. 세 시험의 평균 점수는 몇 점입니까?"
    return en, (a + b + c) / 3, ko, (a + b + c) / 3


def _workers(r):
    boxes, per_hour, hours = r.randint(12, 40), r.randint(3, 6), r.randint(2, 5)
    left = boxes + per_hour * hours * 2
    en = f"Two workers each pack {per_hour} boxes per hour. They work for {hours} hours. {boxes} boxes are still left unpacked after that. How many boxes were there at the start?"
    ko = f"두 사람이 각각 한 시간에 상자 {per_hour}개씩 포장합니다. {hours}시간 동안 일한 뒤에도 상자 {boxes}개가 남았습니다. 처음에 상자는 몇 개였습니까?"
    return en, left, ko, left


MATH = (_shop, _speed, _discount, _share, _age, _garden, _average, _workers)
MATH_PER_LANGUAGE = 30


def math_items(r: random.Random) -> list[dict]:
    out = []
    for i in range(MATH_PER_LANGUAGE * 2):
        en, en_ans, ko, ko_ans = MATH[i % len(MATH)](r)
        for lang, text, ans in (("en", en, en_ans), ("ko", ko, ko_ans)):
            if (i < MATH_PER_LANGUAGE) != (lang == "en"):
                continue  # first half English, second half Korean: fresh numbers for each
            ans = int(ans) if float(ans).is_integer() else ans
            number = i % MATH_PER_LANGUAGE + 1
            tail = (
                " Give the final answer as a single number on the last line."
                if lang == "en"
                else " 마지막 줄에 최종 답을 숫자 하나로 쓰세요."
            )
            reference = f"Answer: {_n(ans)}" if lang == "en" else f"답: {_n(ans)}"
            wrong = _n(ans + max(1, round(abs(ans) * 0.1)))
            answer = {"scorer": "numeric", "expected": ans, "tolerance": 0.01}
            out.append(
                _item(
                    f"math-{lang}-{number:03d}",
                    "math",
                    lang,
                    text + tail,
                    answer,
                    reference,
                    wrong,
                    384,
                )
            )
    return out


# --- JSON extraction: each record writes the text and is the expected object ---

EN_PEOPLE = [
    ("Hannah Okafor", 29, "hannah.okafor@example.com", "Leeds"),
    ("Mateo Silva", 41, "mateo.silva@example.org", "Porto"),
    ("Priya Raman", 35, "p.raman@example.net", "Chennai"),
    ("Jonas Berg", 52, "jonas.berg@example.com", "Uppsala"),
    ("Amara Diallo", 23, "amara.d@example.org", "Dakar"),
    ("Liam Walsh", 38, "liam.walsh@example.com", "Galway"),
]
KO_PEOPLE = [
    ("김민준", 34, "minjun.kim@example.com", "부산"),
    ("이서연", 27, "seoyeon.lee@example.org", "대전"),
    ("박지호", 45, "jiho.park@example.net", "광주"),
    ("최수아", 31, "sua.choi@example.com", "인천"),
    ("정도윤", 58, "doyoon.jung@example.org", "대구"),
    ("한지민", 22, "jimin.han@example.com", "수원"),
]
EN_ORDERS = [
    ("A-1042", "printer paper", 3, 12.5, "USD"),
    ("B-2210", "desk lamp", 1, 34.0, "EUR"),
    ("C-0087", "USB-C cable", 6, 7.25, "USD"),
    ("D-3391", "office chair", 2, 149.0, "GBP"),
    ("E-5120", "whiteboard marker", 12, 1.8, "EUR"),
]
KO_ORDERS = [
    ("K-3301", "무선 마우스", 2, 25000, "KRW"),
    ("K-4410", "보온 물병", 4, 18000, "KRW"),
    ("K-5127", "가죽 지갑", 1, 65000, "KRW"),
    ("K-6093", "전기 주전자", 3, 32000, "KRW"),
    ("K-7258", "면 수건 세트", 5, 12000, "KRW"),
]
EN_EVENTS = [
    ("Quarterly capacity review", "2026-03-14", "09:30", "Room B-12"),
    ("GPU driver upgrade window", "2026-04-02", "22:00", "Data hall 3"),
    ("Onboarding workshop", "2026-05-19", "13:15", "Library annex"),
    ("Incident retrospective", "2026-06-08", "16:45", "Room A-4"),
    ("Vendor demo", "2026-07-21", "11:00", "Conference hall"),
]
KO_EVENTS = [
    ("분기별 용량 점검 회의", "2026-03-16", "10:00", "본관 3층 회의실"),
    ("신입 사원 교육", "2026-04-06", "14:30", "별관 강당"),
    ("장애 회고 회의", "2026-05-11", "16:00", "2층 소회의실"),
    ("서버 점검 작업", "2026-06-13", "23:00", "제2 데이터센터"),
    ("연말 송년회", "2026-12-18", "18:30", "한강 레스토랑"),
]
EN_INCIDENTS = [
    (
        "gpu-07",
        3,
        91,
        "high",
        "At 14:05 UTC host gpu-07 reported GPU 3 at 91 C. Treat it as high severity.",
    ),
    (
        "gpu-12",
        0,
        78,
        "low",
        "Minor note: GPU 0 on gpu-12 touched 78 C during the nightly batch; low severity.",
    ),
    (
        "node-a3",
        5,
        86,
        "medium",
        "node-a3 logged GPU 5 at 86 C after the fan swap, which we rate medium severity.",
    ),
    ("gpu-21", 1, 95, "high", "Page the on-call: gpu-21's GPU 1 hit 95 C, severity high."),
    (
        "infer-4",
        2,
        81,
        "medium",
        "Medium-severity ticket: GPU 2 of infer-4 has been running at 81 C since noon.",
    ),
]
EN_LANGS = [
    ("The service is written in Go, with a small Python tool for migrations.", ["Go", "Python"]),
    (
        "We rewrote the parser from C++ to Rust and kept the tests in Python.",
        ["C++", "Rust", "Python"],
    ),
    (
        "The dashboard uses TypeScript; reports are generated by a Kotlin job.",
        ["TypeScript", "Kotlin"],
    ),
    (
        "Our agent is pure Python, but the kernel module is C and the UI is Elm.",
        ["Python", "C", "Elm"],
    ),
]

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$"},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "email", "city"],
    "additionalProperties": False,
}
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "product": {"type": "string"},
        "quantity": {"type": "integer", "minimum": 1},
        "unit_price": {"type": "number"},
        "currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "KRW"]},
    },
    "required": ["order_id", "product", "quantity", "unit_price", "currency"],
    "additionalProperties": False,
}
EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
        "start": {"type": "string", "pattern": "^\\d{2}:\\d{2}$"},
        "location": {"type": "string"},
    },
    "required": ["title", "date", "start", "location"],
    "additionalProperties": False,
}
INCIDENT_SCHEMA = {
    "type": "object",
    "properties": {
        "host": {"type": "string"},
        "gpu_index": {"type": "integer", "minimum": 0},
        "temperature_c": {"type": "number"},
        "severity": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["host", "gpu_index", "temperature_c", "severity"],
    "additionalProperties": False,
}
LANGS_SCHEMA = {
    "type": "object",
    "properties": {"languages": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["languages"],
    "additionalProperties": False,
}


def _keys(schema: dict) -> str:
    return ", ".join(f"{k} ({v['type']})" for k, v in schema["properties"].items())


def _json_item(id, lang, text, schema, fields, wrong_fields):
    if lang == "en":
        ask = f"Extract the information from the text below. Reply with only a JSON object with the keys {_keys(schema)}.\n\nText: {text}"
    else:
        ask = f"아래 글에서 정보를 뽑아 다음 키를 가진 JSON 객체 하나로만 답하세요: {_keys(schema)}. 값은 글에 적힌 그대로 쓰세요.\n\n글: {text}"
    answer = {"scorer": "json", "schema": schema, "fields": fields}
    reference = json.dumps(fields, ensure_ascii=False)
    wrong = json.dumps(fields | wrong_fields, ensure_ascii=False)
    return _item(id, "json", lang, ask, answer, reference, wrong, 200, structured=True)


def json_items() -> list[dict]:
    out = []
    for i, (name, age, email, city) in enumerate(EN_PEOPLE, 1):
        text = (
            f"Please register {name}, who is {age} years old and lives in {city}. Contact: {email}."
        )
        f = {"name": name, "age": age, "email": email, "city": city}
        out.append(
            _json_item(f"json-en-person-{i}", "en", text, PERSON_SCHEMA, f, {"age": age + 1})
        )
    for i, (name, age, email, city) in enumerate(KO_PEOPLE, 1):
        text = f"{city}에 사는 {name} 님({age}세)을 회원으로 등록해 주세요. 연락용 이메일은 {email}입니다."
        f = {"name": name, "age": age, "email": email, "city": city}
        out.append(
            _json_item(f"json-ko-person-{i}", "ko", text, PERSON_SCHEMA, f, {"city": "서울"})
        )
    for i, (oid, product, qty, price, cur) in enumerate(EN_ORDERS, 1):
        text = f"Order {oid}: {qty} x {product} at {price:.2f} {cur} each, to be shipped next week."
        f = {
            "order_id": oid,
            "product": product,
            "quantity": qty,
            "unit_price": price,
            "currency": cur,
        }
        out.append(
            _json_item(f"json-en-order-{i}", "en", text, ORDER_SCHEMA, f, {"quantity": qty + 1})
        )
    for i, (oid, product, qty, price, cur) in enumerate(KO_ORDERS, 1):
        text = (
            f"주문번호 {oid}: {product} {qty}개, 개당 {price:,}원(통화 코드 {cur})에 주문했습니다."
        )
        f = {
            "order_id": oid,
            "product": product,
            "quantity": qty,
            "unit_price": price,
            "currency": cur,
        }
        out.append(
            _json_item(f"json-ko-order-{i}", "ko", text, ORDER_SCHEMA, f, {"product": "마우스"})
        )
    for i, (title, date, start, place) in enumerate(EN_EVENTS, 1):
        text = f'Reminder: "{title}" takes place on {date}, starting at {start}, in {place}.'
        f = {"title": title, "date": date, "start": start, "location": place}
        out.append(
            _json_item(f"json-en-event-{i}", "en", text, EVENT_SCHEMA, f, {"start": "12:00"})
        )
    for i, (title, date, start, place) in enumerate(KO_EVENTS, 1):
        y, m, d = date.split("-")
        text = f"알림: '{title}'은(는) {date}({int(y)}년 {int(m)}월 {int(d)}일) {start}에 {place}에서 열립니다."
        f = {"title": title, "date": date, "start": start, "location": place}
        out.append(
            _json_item(f"json-ko-event-{i}", "ko", text, EVENT_SCHEMA, f, {"location": "회의실"})
        )
    for i, (host, gpu, temp, sev, text) in enumerate(EN_INCIDENTS, 1):
        f = {"host": host, "gpu_index": gpu, "temperature_c": temp, "severity": sev}
        out.append(
            _json_item(
                f"json-en-incident-{i}", "en", text, INCIDENT_SCHEMA, f, {"gpu_index": gpu + 1}
            )
        )
    for i, (text, langs) in enumerate(EN_LANGS, 1):
        text += " List the programming languages in the order they appear."
        f = {"languages": langs}
        out.append(
            _json_item(
                f"json-en-langs-{i}", "en", text, LANGS_SCHEMA, f, {"languages": langs[::-1]}
            )
        )
    return out


# --- long-context retrieval: digit-free filler, so the planted number occurs exactly once ---

EN_FILLER = [
    "The harbour town of Velmont wakes early, when the fishing boats return with the tide.",
    "Along the quay, the market stalls open one by one and the smell of bread drifts over the water.",
    "The council meets in the old customs house, a stone building with a slate roof and narrow windows.",
    "Most residents cycle to work, and the town keeps a small fleet of shared bicycles near the station.",
    "In winter the wind comes from the north and the ferries sometimes wait in port for calmer seas.",
    "The library holds maps of the coast drawn by hand long before the first survey ships arrived.",
    "Children learn to swim in the sheltered bay, where the water stays shallow far from the beach.",
    "The lighthouse keeper writes a short note in the logbook every evening about the weather and the ships.",
    "A narrow railway line links Velmont with the valley towns, and the trains are slow but reliable.",
    "Every spring the gardeners plant rows of tulips along the promenade and repaint the benches.",
    "The fish auction is loud and fast, and buyers signal their bids with small movements of the hand.",
    "On market days the square fills with farmers selling cheese, apples, honey and woollen blankets.",
    "The old shipyard has become a workshop where volunteers restore wooden boats for the museum.",
    "Fog rolls in from the sea on autumn mornings and usually lifts before the shops open.",
    "The town band practises on Thursday evenings in the hall behind the church.",
    "Walkers follow the cliff path to the ruined watchtower, which offers a view across the whole bay.",
    "The school choir sings at the harbour festival, and the bakers sell sweet rolls shaped like anchors.",
    "Repairs to the sea wall are planned each year after the winter storms have passed.",
    "The post office still sorts letters by hand, and the postwoman knows every family by name.",
    "At night the harbour lights reflect on the water and the only sound is the creak of moored boats.",
    "Visitors often ask about the old smuggling tunnels, though most of them collapsed long ago.",
    "The cooperative dairy collects milk from the hill farms every morning with a small green truck.",
    "Seabirds nest on the rocks below the lighthouse, and the area is closed to climbers in spring.",
    "The ferry timetable changes twice a year, and the new one is posted on the door of the ticket office.",
]
KO_FILLER = [
    "바닷가 마을 해솔은 고깃배가 돌아오는 이른 아침부터 하루를 시작합니다.",
    "부두를 따라 시장 가게들이 하나둘 문을 열고 갓 구운 빵 냄새가 바다 위로 퍼집니다.",
    "마을 회의는 돌로 지은 옛 세관 건물에서 열리며 창문이 좁고 지붕은 검은 슬레이트입니다.",
    "주민 대부분은 자전거로 출근하고 역 앞에는 함께 쓰는 자전거가 늘 세워져 있습니다.",
    "겨울에는 북쪽에서 바람이 불어와 여객선이 잔잔한 날을 기다리며 항구에 머물기도 합니다.",
    "도서관에는 측량선이 오기 훨씬 전에 손으로 그린 해안 지도가 보관되어 있습니다.",
    "아이들은 물이 얕고 잔잔한 만에서 수영을 배우며 여름을 보냅니다.",
    "등대지기는 저녁마다 날씨와 지나간 배에 대해 일지에 짧은 글을 남깁니다.",
    "좁은 철길이 해솔과 골짜기 마을들을 잇고 있으며 기차는 느리지만 늘 제시간에 옵니다.",
    "봄이 오면 정원사들이 산책로를 따라 튤립을 심고 벤치를 새로 칠합니다.",
    "수산물 경매장은 시끄럽고 빠르게 돌아가며 상인들은 손짓으로 값을 부릅니다.",
    "장날이면 광장은 치즈와 사과와 꿀과 담요를 파는 농부들로 가득 찹니다.",
    "옛 조선소는 자원봉사자들이 박물관에 전시할 나무배를 고치는 작업장이 되었습니다.",
    "가을 아침에는 바다에서 안개가 밀려오지만 가게가 문을 열 무렵이면 대개 걷힙니다.",
    "마을 악단은 목요일 저녁마다 성당 뒤 강당에서 연습을 합니다.",
    "산책하는 사람들은 절벽 길을 따라 무너진 망루까지 걸으며 만 전체를 내려다봅니다.",
    "겨울 폭풍이 지나가면 해마다 방파제 보수 공사가 계획됩니다.",
    "우체국에서는 아직도 편지를 손으로 분류하고 집배원은 마을 사람들을 모두 알고 있습니다.",
]
EN_FACTS = [
    (
        "The access code for the north storage room is 48213.",
        "What is the access code for the north storage room?",
        "numeric",
        48213,
    ),
    (
        "The ferry captain on the night route is named Ilse Varnholt.",
        "What is the name of the ferry captain on the night route?",
        "exact",
        "Ilse Varnholt",
    ),
    (
        "The new lighthouse lamp has a rated life of 31750 hours.",
        "What is the rated life of the new lighthouse lamp, in hours?",
        "numeric",
        31750,
    ),
    (
        "The harbour master keeps the spare keys in a blue tin labelled Orchid.",
        "What word is on the label of the tin that holds the spare keys?",
        "exact",
        "Orchid",
    ),
    (
        "The rowing regatta raised 7260 euros for the library roof.",
        "How many euros did the rowing regatta raise for the library roof?",
        "numeric",
        7260,
    ),
    (
        "The town's backup server is called kestrel-nine.",
        "What is the name of the town's backup server?",
        "exact",
        "kestrel-nine",
    ),
    (
        "The bakery on Quay Street calls its sourdough starter Old Marta.",
        "What does the bakery on Quay Street call its sourdough starter?",
        "exact",
        "Old Marta",
    ),
    (
        "The tide gauge on the east pier was last calibrated by the firm Halvard and Sons.",
        "Which firm last calibrated the tide gauge on the east pier?",
        "exact",
        "Halvard and Sons",
    ),
]
KO_FACTS = [
    (
        "북쪽 창고의 출입 비밀번호는 59317입니다.",
        "북쪽 창고의 출입 비밀번호는 무엇입니까?",
        "numeric",
        59317,
    ),
    (
        "야간 여객선의 선장 이름은 남궁도윤입니다.",
        "야간 여객선 선장의 이름은 무엇입니까?",
        "exact",
        "남궁도윤",
    ),
    (
        "등대의 예비 열쇠는 '목련'이라고 적힌 파란 상자에 보관되어 있습니다.",
        "등대 예비 열쇠를 보관하는 파란 상자에는 어떤 말이 적혀 있습니까?",
        "exact",
        "목련",
    ),
    (
        "올해 조정 대회에서 모은 기부금은 8460만 원입니다.",
        "올해 조정 대회에서 모은 기부금은 몇만 원입니까?",
        "numeric",
        8460,
    ),
]


def _document(r: random.Random, filler: list[str], fact: str, target_chars: int, joiner: str):
    paragraphs, size = [], 0
    while size < target_chars:
        sentences = r.sample(filler, r.randint(4, 7))
        paragraphs.append(joiner.join(sentences))
        size += len(paragraphs[-1]) + 2
    where = r.randint(len(paragraphs) // 10, len(paragraphs) - 1 - len(paragraphs) // 10)
    paragraphs[where] = paragraphs[where] + joiner + fact
    return "\n\n".join(paragraphs)


def long_context_items(r: random.Random) -> list[dict]:
    out = []
    plans = [("en", f, EN_FILLER, (14000, 22000), " ") for f in EN_FACTS]
    plans += [("ko", f, KO_FILLER, (6000, 9000), " ") for f in KO_FACTS]
    count = {"en": 0, "ko": 0}
    for lang, (fact, question, scorer, expected), filler, (low, high), joiner in plans:
        count[lang] += 1
        doc = _document(r, filler, fact, r.randint(low, high), joiner)
        if lang == "en":
            text = f"Read the document below and answer the question after it.\n\n<document>\n{doc}\n</document>\n\nQuestion: {question} Answer with only the answer."
        else:
            text = f"아래 문서를 읽고 문서 뒤의 질문에 답하세요.\n\n<document>\n{doc}\n</document>\n\n질문: {question} 답만 쓰세요."
        if scorer == "numeric":
            answer = {"scorer": "numeric", "expected": expected}
            reference, wrong = str(expected), str(expected + 1000)
        else:
            answer = {"scorer": "exact", "expected": expected}
            reference, wrong = expected, ("Velmont" if lang == "en" else "해솔")
        out.append(
            _item(
                f"long-{lang}-{count[lang]:03d}",
                "long_context",
                lang,
                text,
                answer,
                reference,
                wrong,
                32,
            )
        )
    return out


def render() -> dict[str, str]:
    """File name -> JSONL text, from the fixed seed."""
    r = random.Random(SEED)
    files = {
        "math.jsonl": math_items(r),
        "json.jsonl": json_items(),
        "long-context.jsonl": long_context_items(r),
    }
    return {
        name: "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items)
        for name, items in files.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args()
    stale = []
    for name, text in render().items():
        path = SETS / name
        if args.check:
            if not path.exists() or path.read_text("utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, "utf-8")
            print(f"wrote {path} ({text.count(chr(10))} items)")
    if stale:
        print(f"out of date: {', '.join(stale)} (run scripts/make_probe_sets.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
