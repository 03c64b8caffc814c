"""The language gate's cost and accuracy: lingua over GRRM's step of 512 groups x 8 candidates.

The candidates are composed from a built-in corpus (the same twelve sentences and three short phrases in
the gate's ten languages and in ja, th and uk, written for this bench): translations in the group's target
language (single sentences, short phrases, paragraphs, a paragraph quoting a phrase in another language),
untranslated copies of the source, sentences in a third language, a target sentence followed by a sentence
in another language, numbers and symbols, and empty or blank texts. Each known candidate carries the
verdict it owes (passes iff it is in the target language, or the target is not gated, or it is blank);
mixed and symbol-only candidates owe none and are left out of the accuracy count.

Each detector mode (``deployments/language_detection.py``) runs in a process of its own (a clean load
time and memory): lingua's ``detect_language_of`` per text (``serial``) or its
``detect_languages_in_parallel_of`` per group (``parallel``), on one core (the process pinned to one CPU
with ``sched_setaffinity`` and lingua's rayon pool held to one thread with ``RAYON_NUM_THREADS=1``) or
on every core of the machine. The gate runs per group, as the replica calls it (``LanguageGate.passes``).

    .venv/bin/python -m bench.language_gate           # writes bench/results/language_gate.json
    .venv/bin/python -m bench.language_gate --quick   # 16 groups, the low-accuracy mode only (CI smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from bench.common import machine, print_table, write_json

COMMAND = ".venv/bin/python -m bench.language_gate"

# Twelve sentences with the same meanings in every language, then three short phrases (thanks, a
# greeting, a farewell): translations of one another, as a group's candidates are.
CORPUS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "en": ((
        "The meeting has been postponed until next Tuesday because of the storm.",
        "Please make sure that all windows are closed before you leave the building.",
        "The new library will open to the public in the spring of next year.",
        "According to the report, unemployment fell slightly in the third quarter.",
        "She has been learning to play the piano since she was seven years old.",
        "If the problem persists, restart the device and contact customer support.",
        "The museum's collection includes more than two thousand paintings from the nineteenth century.",
        "We would like to thank all volunteers for their help during the festival.",
        "The train to the airport leaves every fifteen minutes from platform four.",
        "Scientists have discovered a new species of frog in the rainforest.",
        "Drinking enough water is important, especially on hot summer days.",
        "The company plans to hire two hundred new employees by the end of the year.",
    ), ("Thank you very much.", "Good morning!", "See you tomorrow.")),
    "de": ((
        "Die Sitzung wurde wegen des Sturms auf nächsten Dienstag verschoben.",
        "Bitte stellen Sie sicher, dass alle Fenster geschlossen sind, bevor Sie das Gebäude verlassen.",
        "Die neue Bibliothek wird im Frühjahr nächsten Jahres für die Öffentlichkeit geöffnet.",
        "Laut dem Bericht ist die Arbeitslosigkeit im dritten Quartal leicht gesunken.",
        "Sie lernt Klavier spielen, seit sie sieben Jahre alt ist.",
        "Wenn das Problem weiterhin besteht, starten Sie das Gerät neu und wenden Sie sich an den Kundendienst.",
        "Die Sammlung des Museums umfasst mehr als zweitausend Gemälde aus dem neunzehnten Jahrhundert.",
        "Wir möchten allen Freiwilligen für ihre Hilfe während des Festivals danken.",
        "Der Zug zum Flughafen fährt alle fünfzehn Minuten von Gleis vier ab.",
        "Wissenschaftler haben im Regenwald eine neue Froschart entdeckt.",
        "Ausreichend Wasser zu trinken ist wichtig, besonders an heißen Sommertagen.",
        "Das Unternehmen plant, bis Ende des Jahres zweihundert neue Mitarbeiter einzustellen.",
    ), ("Vielen Dank!", "Guten Morgen!", "Bis morgen.")),
    "fr": ((
        "La réunion a été reportée à mardi prochain à cause de la tempête.",
        "Veuillez vous assurer que toutes les fenêtres sont fermées avant de quitter le bâtiment.",
        "La nouvelle bibliothèque ouvrira ses portes au public au printemps de l'année prochaine.",
        "Selon le rapport, le chômage a légèrement baissé au troisième trimestre.",
        "Elle apprend à jouer du piano depuis l'âge de sept ans.",
        "Si le problème persiste, redémarrez l'appareil et contactez le service client.",
        "La collection du musée comprend plus de deux mille tableaux du dix-neuvième siècle.",
        "Nous tenons à remercier tous les bénévoles pour leur aide pendant le festival.",
        "Le train pour l'aéroport part toutes les quinze minutes du quai numéro quatre.",
        "Des scientifiques ont découvert une nouvelle espèce de grenouille dans la forêt tropicale.",
        "Boire suffisamment d'eau est important, surtout pendant les chaudes journées d'été.",
        "L'entreprise prévoit d'embaucher deux cents nouveaux employés d'ici la fin de l'année.",
    ), ("Merci beaucoup.", "Bonjour !", "À demain.")),
    "es": ((
        "La reunión se ha aplazado hasta el próximo martes debido a la tormenta.",
        "Por favor, asegúrese de que todas las ventanas estén cerradas antes de salir del edificio.",
        "La nueva biblioteca abrirá al público en la primavera del próximo año.",
        "Según el informe, el desempleo bajó ligeramente en el tercer trimestre.",
        "Ella aprende a tocar el piano desde que tenía siete años.",
        "Si el problema persiste, reinicie el dispositivo y póngase en contacto con atención al cliente.",
        "La colección del museo incluye más de dos mil pinturas del siglo diecinueve.",
        "Queremos agradecer a todos los voluntarios su ayuda durante el festival.",
        "El tren al aeropuerto sale cada quince minutos desde el andén cuatro.",
        "Los científicos han descubierto una nueva especie de rana en la selva tropical.",
        "Beber suficiente agua es importante, sobre todo en los días calurosos de verano.",
        "La empresa planea contratar a doscientos nuevos empleados antes de fin de año.",
    ), ("Muchas gracias.", "¡Buenos días!", "Hasta mañana.")),
    "pt": ((
        "A reunião foi adiada para a próxima terça-feira por causa da tempestade.",
        "Por favor, certifique-se de que todas as janelas estão fechadas antes de sair do edifício.",
        "A nova biblioteca será aberta ao público na primavera do próximo ano.",
        "Segundo o relatório, o desemprego caiu ligeiramente no terceiro trimestre.",
        "Ela aprende a tocar piano desde os sete anos de idade.",
        "Se o problema continuar, reinicie o aparelho e entre em contato com o suporte ao cliente.",
        "O acervo do museu inclui mais de duas mil pinturas do século dezenove.",
        "Gostaríamos de agradecer a todos os voluntários pela ajuda durante o festival.",
        "O trem para o aeroporto sai a cada quinze minutos da plataforma quatro.",
        "Cientistas descobriram uma nova espécie de sapo na floresta tropical.",
        "Beber água suficiente é importante, principalmente nos dias quentes de verão.",
        "A empresa pretende contratar duzentos novos funcionários até o final do ano.",
    ), ("Muito obrigado.", "Bom dia!", "Até amanhã.")),
    "it": ((
        "La riunione è stata rinviata a martedì prossimo a causa della tempesta.",
        "Si prega di assicurarsi che tutte le finestre siano chiuse prima di lasciare l'edificio.",
        "La nuova biblioteca aprirà al pubblico nella primavera del prossimo anno.",
        "Secondo il rapporto, la disoccupazione è leggermente diminuita nel terzo trimestre.",
        "Studia pianoforte da quando aveva sette anni.",
        "Se il problema persiste, riavviare il dispositivo e contattare l'assistenza clienti.",
        "La collezione del museo comprende più di duemila dipinti del diciannovesimo secolo.",
        "Desideriamo ringraziare tutti i volontari per il loro aiuto durante il festival.",
        "Il treno per l'aeroporto parte ogni quindici minuti dal binario quattro.",
        "Gli scienziati hanno scoperto una nuova specie di rana nella foresta pluviale.",
        "Bere abbastanza acqua è importante, soprattutto nelle calde giornate estive.",
        "L'azienda prevede di assumere duecento nuovi dipendenti entro la fine dell'anno.",
    ), ("Grazie mille.", "Buongiorno!", "A domani.")),
    "nl": ((
        "De vergadering is vanwege de storm uitgesteld tot volgende dinsdag.",
        "Zorg ervoor dat alle ramen gesloten zijn voordat u het gebouw verlaat.",
        "De nieuwe bibliotheek gaat in het voorjaar van volgend jaar open voor het publiek.",
        "Volgens het rapport is de werkloosheid in het derde kwartaal licht gedaald.",
        "Ze leert piano spelen sinds ze zeven jaar oud is.",
        "Als het probleem aanhoudt, start u het apparaat opnieuw op en neemt u contact op met de klantenservice.",
        "De collectie van het museum omvat meer dan tweeduizend schilderijen uit de negentiende eeuw.",
        "Wij willen alle vrijwilligers bedanken voor hun hulp tijdens het festival.",
        "De trein naar het vliegveld vertrekt elk kwartier vanaf spoor vier.",
        "Wetenschappers hebben in het regenwoud een nieuwe kikkersoort ontdekt.",
        "Voldoende water drinken is belangrijk, vooral op warme zomerdagen.",
        "Het bedrijf is van plan om voor het einde van het jaar tweehonderd nieuwe medewerkers aan te nemen.",
    ), ("Dank je wel.", "Goedemorgen!", "Tot morgen.")),
    "ru": ((
        "Из-за шторма совещание перенесли на следующий вторник.",
        "Пожалуйста, убедитесь, что все окна закрыты, прежде чем покинуть здание.",
        "Новая библиотека откроется для посетителей весной следующего года.",
        "Согласно отчёту, в третьем квартале безработица немного снизилась.",
        "Она учится играть на фортепиано с семи лет.",
        "Если проблема не исчезнет, перезагрузите устройство и обратитесь в службу поддержки.",
        "В коллекции музея более двух тысяч картин девятнадцатого века.",
        "Мы хотим поблагодарить всех волонтёров за помощь во время фестиваля.",
        "Поезд в аэропорт отправляется каждые пятнадцать минут с четвёртой платформы.",
        "Учёные обнаружили в тропическом лесу новый вид лягушек.",
        "Пить достаточно воды важно, особенно в жаркие летние дни.",
        "Компания планирует нанять двести новых сотрудников до конца года.",
    ), ("Большое спасибо!", "Доброе утро!", "До завтра.")),
    "uk": ((
        "Через шторм нараду перенесли на наступний вівторок.",
        "Будь ласка, переконайтеся, що всі вікна зачинені, перш ніж вийти з будівлі.",
        "Нова бібліотека відкриється для відвідувачів навесні наступного року.",
        "Згідно зі звітом, у третьому кварталі безробіття трохи знизилося.",
        "Вона вчиться грати на фортепіано з семи років.",
        "Якщо проблема не зникне, перезавантажте пристрій і зверніться до служби підтримки.",
        "У колекції музею понад дві тисячі картин дев'ятнадцятого століття.",
        "Ми хочемо подякувати всім волонтерам за допомогу під час фестивалю.",
        "Потяг до аеропорту відправляється кожні п'ятнадцять хвилин з четвертої платформи.",
        "Науковці виявили в тропічному лісі новий вид жаб.",
        "Пити достатньо води важливо, особливо в спекотні літні дні.",
        "Компанія планує найняти двісті нових працівників до кінця року.",
    ), ("Дуже дякую!", "Доброго ранку!", "Побачимося завтра.")),
    "zh": ((
        "由于暴风雨，会议推迟到下周二举行。",
        "离开大楼前，请确保所有窗户都已关好。",
        "新图书馆将于明年春天向公众开放。",
        "报告显示，第三季度失业率略有下降。",
        "她从七岁起就开始学习弹钢琴。",
        "如果问题仍然存在，请重新启动设备并联系客户服务。",
        "该博物馆收藏了两千多幅十九世纪的绘画作品。",
        "我们要感谢所有志愿者在音乐节期间提供的帮助。",
        "开往机场的列车每十五分钟从四号站台发车一班。",
        "科学家在热带雨林中发现了一种新的青蛙。",
        "多喝水很重要，尤其是在炎热的夏天。",
        "该公司计划在年底前招聘两百名新员工。",
    ), ("非常感谢！", "早上好！", "明天见。")),
    "ja": ((
        "嵐のため、会議は来週の火曜日に延期されました。",
        "建物を出る前に、すべての窓が閉まっていることを確認してください。",
        "新しい図書館は来年の春に一般公開される予定です。",
        "報告書によると、第3四半期の失業率はわずかに低下しました。",
        "彼女は七歳のときからピアノを習っています。",
        "問題が解決しない場合は、デバイスを再起動してカスタマーサポートにお問い合わせください。",
        "美術館のコレクションには、19世紀の絵画が二千点以上含まれています。",
        "祭りの期間中に手伝ってくださったボランティアの皆様に感謝申し上げます。",
        "空港行きの電車は4番線から15分ごとに出発します。",
        "科学者たちは熱帯雨林で新種のカエルを発見しました。",
        "特に暑い夏の日には、十分な水を飲むことが大切です。",
        "その会社は年末までに新しい社員を二百人採用する計画です。",
    ), ("ありがとうございます。", "おはようございます！", "また明日。")),
    "ko": ((
        "폭풍 때문에 회의가 다음 주 화요일로 연기되었습니다.",
        "건물을 나가기 전에 모든 창문이 닫혀 있는지 확인해 주세요.",
        "새 도서관은 내년 봄에 일반인에게 개방될 예정입니다.",
        "보고서에 따르면 3분기 실업률이 소폭 하락했습니다.",
        "그녀는 일곱 살 때부터 피아노를 배우고 있습니다.",
        "문제가 계속되면 기기를 다시 시작하고 고객 지원팀에 문의하십시오.",
        "박물관의 소장품에는 19세기 그림이 2천 점 이상 포함되어 있습니다.",
        "축제 기간 동안 도움을 주신 모든 자원봉사자 여러분께 감사드립니다.",
        "공항행 열차는 4번 승강장에서 15분마다 출발합니다.",
        "과학자들이 열대 우림에서 새로운 종의 개구리를 발견했습니다.",
        "특히 더운 여름날에는 물을 충분히 마시는 것이 중요합니다.",
        "그 회사는 연말까지 신입 사원 200명을 채용할 계획입니다.",
    ), ("정말 감사합니다.", "좋은 아침입니다!", "내일 봐요.")),
    "th": ((
        "การประชุมถูกเลื่อนออกไปเป็นวันอังคารหน้าเนื่องจากพายุ",
        "โปรดตรวจสอบให้แน่ใจว่าปิดหน้าต่างทุกบานแล้วก่อนออกจากอาคาร",
        "ห้องสมุดแห่งใหม่จะเปิดให้บริการแก่ประชาชนในฤดูใบไม้ผลิปีหน้า",
        "ตามรายงาน อัตราการว่างงานลดลงเล็กน้อยในไตรมาสที่สาม",
        "เธอเรียนเปียโนมาตั้งแต่อายุเจ็ดขวบ",
        "หากปัญหายังคงอยู่ ให้รีสตาร์ทอุปกรณ์และติดต่อฝ่ายบริการลูกค้า",
        "คอลเลกชันของพิพิธภัณฑ์มีภาพวาดจากศตวรรษที่สิบเก้ามากกว่าสองพันภาพ",
        "เราขอขอบคุณอาสาสมัครทุกคนที่ช่วยเหลือในระหว่างเทศกาล",
        "รถไฟไปสนามบินออกทุกสิบห้านาทีจากชานชาลาที่สี่",
        "นักวิทยาศาสตร์ค้นพบกบสายพันธุ์ใหม่ในป่าฝนเขตร้อน",
        "การดื่มน้ำให้เพียงพอเป็นสิ่งสำคัญ โดยเฉพาะในวันที่อากาศร้อน",
        "บริษัทวางแผนที่จะจ้างพนักงานใหม่สองร้อยคนภายในสิ้นปี",
    ), ("ขอบคุณมาก", "สวัสดีตอนเช้า", "พรุ่งนี้เจอกัน")),
}
GATED = ("en", "zh", "de", "ru", "ko", "fr", "es", "pt", "it", "nl")
UNGATED = ("ja", "th", "uk")
SYMBOLS = ("2024", "15:30", "12,5 %", "---", "42.", "(3/4)", "#1", "…")
BLANKS = ("", " ", "\n", "  \t\n")
# Languages written without spaces between sentences.
_NO_SPACE = {"zh", "ja", "th"}

# What a candidate is, with its weight in a group (the rest of the group draws from these).
KINDS: dict[str, float] = {
    "sentence": 0.52,    # a translation in the target language: owes a pass
    "paragraph": 0.10,   # two or three target sentences
    "short": 0.06,       # a short phrase in the target language
    "quoting": 0.04,     # a target paragraph quoting a short phrase in another language: owes a pass
    "source": 0.10,      # the untranslated source: owes a failure where the target is gated
    "other": 0.05,       # a sentence in a third language
    "short_other": 0.03,
    "mixed": 0.04,       # a target sentence then a sentence in another language: owes nothing
    "symbols": 0.03,     # numbers and punctuation only: owes nothing
    "blank": 0.03,       # empty or whitespace: owes a pass
}


@dataclass(frozen=True)
class Candidate:
    text: str
    kind: str
    language: str | None  # what it is written in; None where it has no single language


@dataclass(frozen=True)
class Group:
    src_lang: str
    trg_lang: str
    candidates: tuple[Candidate, ...]

    def owed(self) -> list[bool | None]:
        """The verdict each candidate owes: None where it has none (mixed, symbols)."""
        gated = self.trg_lang in GATED
        return [None if c.language is None and c.kind != "blank"
                else True if not gated or c.kind == "blank" else c.language == self.trg_lang
                for c in self.candidates]


def _join(language: str, sentences: list[str]) -> str:
    return ("" if language in _NO_SPACE else " ").join(sentences)


def compose(groups: int, group_size: int = 8, seed: int = 56) -> list[Group]:
    """GRRM-like groups: a target (15% outside the ten gated languages), a source, candidates by KINDS."""
    rng = random.Random(seed)
    languages = list(CORPUS)
    out = []
    for _ in range(groups):
        trg = rng.choice(UNGATED) if rng.random() < 0.15 else rng.choice(GATED)
        src = rng.choice([x for x in languages if x != trg])
        meaning = rng.randrange(12)
        candidates = []
        for kind in rng.choices(list(KINDS), weights=list(KINDS.values()), k=group_size):
            other = rng.choice([x for x in languages if x != trg])
            sentences, shorts = CORPUS[trg]
            if kind == "sentence":
                candidate = Candidate(sentences[rng.choice([meaning, rng.randrange(12)])], kind, trg)
            elif kind == "paragraph":
                candidate = Candidate(_join(trg, rng.sample(sentences, rng.randint(2, 3))), kind, trg)
            elif kind == "short":
                candidate = Candidate(rng.choice(shorts), kind, trg)
            elif kind == "quoting":
                quoted = rng.choice(CORPUS[other][1])
                first, second = rng.sample(sentences, 2)
                candidate = Candidate(_join(trg, [first, f"“{quoted}”", second]), kind, trg)
            elif kind == "source":
                candidate = Candidate(CORPUS[src][0][meaning], kind, src)
            elif kind == "other":
                candidate = Candidate(rng.choice(CORPUS[other][0]), kind, other)
            elif kind == "short_other":
                candidate = Candidate(rng.choice(CORPUS[other][1]), kind, other)
            elif kind == "mixed":
                candidate = Candidate(_join(trg, [sentences[meaning], rng.choice(CORPUS[other][0])]), kind, None)
            elif kind == "symbols":
                candidate = Candidate(rng.choice(SYMBOLS), kind, None)
            else:
                candidate = Candidate(rng.choice(BLANKS), "blank", None)
            candidates.append(candidate)
        out.append(Group(src, trg, tuple(candidates)))
    return out


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def _max_stall_ms(work) -> float:
    """The longest the main thread waited for the GIL while ``work`` ran on a worker thread (as the
    replica runs the gate with ``asyncio.to_thread``): a 1 ms ticker's largest gap."""
    worker = threading.Thread(target=work)
    # From before the start: start() itself waits for the GIL when the worker took it at once.
    longest, last = 0.0, time.perf_counter()
    worker.start()
    while worker.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    return longest * 1000


def measure(mode: str, api: str, one_core: bool, groups: int, repeats: int) -> dict:
    """One detector configuration in this (fresh) process: load, gate every group, accuracy."""
    if one_core:
        # One CPU of those this process may use; RAYON_NUM_THREADS=1 came from the parent's environment.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    step = compose(groups)
    rss_before = _rss_mb()
    cpu, wall = time.process_time(), time.perf_counter()
    from cluster.language_gate import LanguageGate
    from deployments.language_detection import lingua_detector

    detector = lingua_detector(mode, parallel=api == "parallel")
    # The ten languages once each: a lazy mode loads the models these need.
    detector.detect([CORPUS[code][0][0] for code in GATED])
    load_cpu_s, load_wall_s = time.process_time() - cpu, time.perf_counter() - wall
    gate = LanguageGate(detector)

    def gate_step() -> list[list[bool]]:
        return [gate.passes(group.trg_lang, [c.text for c in group.candidates]) for group in step]

    cpu = time.process_time()
    verdicts = gate_step()
    first_pass_cpu_s = time.process_time() - cpu
    cpu_s, wall_s = [], []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        again = gate_step()
        cpu_s.append(time.process_time() - cpu)
        wall_s.append(time.perf_counter() - wall)
        assert again == verdicts, "the same candidates got different verdicts"
    # The whole step's checked texts in one detector call, as a batch path would send them.
    checked = [c.text for g in step if g.trg_lang in GATED for c in g.candidates if c.text.strip()]
    cpu, wall = time.process_time(), time.perf_counter()
    detector.detect(checked)
    one_call_cpu_s, one_call_wall_s = time.process_time() - cpu, time.perf_counter() - wall

    owed = [o for g in step for o in g.owed()]
    flat = [v for vs in verdicts for v in vs]
    known = [(o, v) for o, v in zip(owed, flat) if o is not None]
    candidates = sum(len(g.candidates) for g in step)
    cpu_median = statistics.median(cpu_s)
    return {
        "mode": mode, "api": api, "cores": 1 if one_core else len(os.sched_getaffinity(0)),
        "candidates": candidates,
        "checked": len(checked),
        "cpu_s": cpu_median,
        "cpu_s_min": min(cpu_s),
        "wall_s": statistics.median(wall_s),
        "cpu_s_per_1000": cpu_median * 1000 / candidates,
        "load_cpu_s": load_cpu_s,
        "load_wall_s": load_wall_s,
        "first_pass_cpu_s": first_pass_cpu_s,
        "one_call_cpu_s": one_call_cpu_s,
        "one_call_wall_s": one_call_wall_s,
        "rss_mb": _rss_mb() - rss_before,
        "max_stall_ms_per_group": _max_stall_ms(gate_step),
        "max_stall_ms_one_call": _max_stall_ms(lambda: detector.detect(checked)),
        "gated": flat.count(False),
        "owed": len(known),
        "wrong": sum(o != v for o, v in known),
        "wrongly_gated": sum(o and not v for o, v in known),
        "wrongly_passed": sum(v and not o for o, v in known),
        "verdicts": ["".join("1" if v else "0" for v in vs) for vs in verdicts],
    }


def _run_child(mode: str, api: str, one_core: bool, groups: int, repeats: int) -> dict:
    env = dict(os.environ)
    if one_core:
        env["RAYON_NUM_THREADS"] = "1"
    else:
        env.pop("RAYON_NUM_THREADS", None)
    args = [sys.executable, "-m", "bench.language_gate", "--child", mode, api, "1" if one_core else "0",
            "--groups", str(groups), "--repeats", str(repeats)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[2:])} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report_section(results: list[dict]) -> str:
    """docs/benchmarks.md's section: one row per mode, API and core count (results: language_gate.json's rows)."""
    from bench.report import machine_line, table

    columns = ["mode", "api", "cores", "default", "candidates", "cpu_s", "cpu_s_min", "wall_s", "cpu_s_per_1000",
               "load_cpu_s", "first_pass_cpu_s", "rss_mb", "max_stall_ms_per_group", "one_call_wall_s",
               "max_stall_ms_one_call", "gated", "owed", "wrong", "wrongly_gated", "wrongly_passed", "differs_from_lazy"]
    return "\n".join([
        "## The language gate: lingua on GRRM's step of 512 x 8 candidates",
        "",
        f"Command: `{COMMAND}`",
        "",
        machine_line("language_gate"),
        "",
        "Real lingua (`lingua-language-detector` 2.1.1) over the gate's ten languages, `LanguageGate.passes` per "
        "group as the replica calls it, on candidates composed from a built-in corpus in the ten languages and "
        "ja, th, uk (`bench/language_gate.py`: translations, short phrases, paragraphs, untranslated sources, "
        "third languages, mixed texts, symbols, blanks). Each row is a fresh process. `cores` 1: pinned to one "
        "CPU and lingua's rayon pool held to one thread (`RAYON_NUM_THREADS=1`); `cpu_s`: the process's CPU "
        "seconds for the whole step (median of the repeats, `cpu_s_min` the least; the issue's target is 1 s "
        "of one core), `wall_s` beside it (the machine is shared). `api` serial: `detect_language_of` per text; parallel: "
        "`detect_languages_in_parallel_of` per group. `load_cpu_s`: building the detector and one sentence per "
        "language; `first_pass_cpu_s`: the first step (a lazy mode loads models there); `rss_mb`: the process's "
        "memory grown by lingua; `max_stall_ms_per_group`: the longest another thread waited for the GIL while "
        "a worker thread gated the step group by group (as the replica's event loop waits; CPython hands the GIL "
        "over every 5 ms at best); `one_call_wall_s`: the whole step's checked texts in one detector call, and "
        "`max_stall_ms_one_call` the same wait then. `owed`: candidates with a "
        "known verdict (mixed and symbol-only ones have none); `wrong`: verdicts not owed, as `wrongly_gated` "
        "(a translation refused) and `wrongly_passed`; `differs_from_lazy`: verdicts unlike lingua's default "
        "mode (the reference's). `default`: what `lingua_detector()` builds.",
        "",
        table(results, columns),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 groups, the low-accuracy mode only (CI smoke run)")
    parser.add_argument("--groups", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "API", "ONE_CORE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, api, one_core = args.child
        print(json.dumps(measure(mode, api, one_core == "1", args.groups, args.repeats)))
        return 0

    from deployments.language_detection import DEFAULT_MODE, DETECTOR_MODES

    modes = ["lazy", "low_accuracy"] if args.quick else list(DETECTOR_MODES)
    if args.quick:
        args.groups, args.repeats = 16, 1
    # One text at a time runs on the calling thread only: more cores change nothing for it.
    configurations = [(mode, api, one_core) for mode in modes
                      for api, one_core in (("serial", True), ("parallel", True), ("parallel", False))]
    if args.quick:
        configurations = [(mode, "serial", True) for mode in modes] + [("low_accuracy", "parallel", False)]
    rows = [_run_child(mode, api, one_core, args.groups, args.repeats) for mode, api, one_core in configurations]
    reference = next(row["verdicts"] for row in rows if row["mode"] == "lazy")
    for row in rows:
        verdicts = row.pop("verdicts")
        row["differs_from_lazy"] = sum(a != b for va, vb in zip(verdicts, reference) for a, b in zip(va, vb))
        row["default"] = row["mode"] == DEFAULT_MODE and row["api"] == "serial" and row["cores"] == 1
    print_table(rows, ["mode", "api", "cores", "default", "cpu_s", "cpu_s_min", "wall_s", "cpu_s_per_1000", "load_cpu_s",
                       "first_pass_cpu_s", "rss_mb", "one_call_wall_s", "max_stall_ms_one_call", "gated", "wrong",
                       "wrongly_gated", "wrongly_passed", "differs_from_lazy"])
    step = compose(args.groups)
    kinds = {kind: sum(c.kind == kind for g in step for c in g.candidates) for kind in KINDS}
    path = write_json("language_gate", rows, {
        "machine": machine(), "quick": args.quick, "groups": args.groups, "group_size": 8, "repeats": args.repeats,
        "candidates_by_kind": kinds, "targets_gated": sum(g.trg_lang in GATED for g in step),
        "command": COMMAND + (" --quick" if args.quick else ""),
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
