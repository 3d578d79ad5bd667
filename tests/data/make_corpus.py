"""The tests' toy corpus: ``python tests/data/make_corpus.py`` writes ``{split}.{lang}.gz`` beside this file.

A line-aligned English/German/French corpus laid out as Multi30k's folder is (splits train, val and
test_2016_flickr; the file names ``ltfm``'s ``data.path`` reads), for the tests that need a corpus but not
Multi30k itself (tests/conftest.py's ``data_dir`` where ``../shared/data/multi30k`` is absent). Each sentence is
a subject, an action and a place drawn from the small phrase lists below, each phrase given in the three languages,
so the translations are word-for-word simple but real. Deterministic (a seeded ``random.Random``, gzip's mtime 0):
running it again rewrites the committed files byte for byte.
"""
from __future__ import annotations

import gzip
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPLITS = {"train": 1000, "val": 200, "test_2016_flickr": 200}
LANGS = ("en", "de", "fr")
SEED = 30

SUBJECTS = [
    ("A man", "Ein Mann", "Un homme"),
    ("A woman", "Eine Frau", "Une femme"),
    ("A boy", "Ein Junge", "Un garçon"),
    ("A girl", "Ein Mädchen", "Une fille"),
    ("A dog", "Ein Hund", "Un chien"),
    ("A child", "Ein Kind", "Un enfant"),
    ("An old man", "Ein alter Mann", "Un vieil homme"),
    ("A young woman", "Eine junge Frau", "Une jeune femme"),
    ("A little girl", "Ein kleines Mädchen", "Une petite fille"),
    ("A man in a red shirt", "Ein Mann in einem roten Hemd", "Un homme en chemise rouge"),
    ("A woman in a blue dress", "Eine Frau in einem blauen Kleid", "Une femme en robe bleue"),
    ("A black dog", "Ein schwarzer Hund", "Un chien noir"),
    ("A brown dog", "Ein brauner Hund", "Un chien marron"),
    ("A worker", "Ein Arbeiter", "Un ouvrier"),
    ("A musician", "Ein Musiker", "Un musicien"),
    ("A cyclist", "Ein Radfahrer", "Un cycliste"),
]
ACTIONS = [
    ("is walking", "geht", "marche"),
    ("is running", "läuft", "court"),
    ("is resting", "ruht sich aus", "se repose"),
    ("is standing", "steht", "se tient debout"),
    ("is playing the guitar", "spielt Gitarre", "joue de la guitare"),
    ("is reading a book", "liest ein Buch", "lit un livre"),
    ("is eating an apple", "isst einen Apfel", "mange une pomme"),
    ("is riding a bike", "fährt Fahrrad", "fait du vélo"),
    ("is jumping", "springt", "saute"),
    ("is sleeping", "schläft", "dort"),
    ("is singing", "singt", "chante"),
    ("is talking on the phone", "telefoniert", "parle au téléphone"),
    ("is carrying a bag", "trägt eine Tasche", "porte un sac"),
    ("is looking at the water", "schaut auf das Wasser", "regarde l'eau"),
    ("is throwing a ball", "wirft einen Ball", "lance une balle"),
    ("is climbing a rock", "klettert auf einen Felsen", "escalade un rocher"),
    ("is waiting", "wartet", "attend"),
    ("is smiling", "lächelt", "sourit"),
]
PLACES = [
    ("in the park", "im Park", "dans le parc"),
    ("on the street", "auf der Straße", "dans la rue"),
    ("on the beach", "am Strand", "sur la plage"),
    ("in the snow", "im Schnee", "dans la neige"),
    ("near a building", "neben einem Gebäude", "près d'un bâtiment"),
    ("in front of a store", "vor einem Geschäft", "devant un magasin"),
    ("in the kitchen", "in der Küche", "dans la cuisine"),
    ("on a bench", "auf einer Bank", "sur un banc"),
    ("in the city", "in der Stadt", "en ville"),
    ("by the river", "am Fluss", "au bord de la rivière"),
    ("on the grass", "auf dem Gras", "sur l'herbe"),
    ("in a field", "auf einem Feld", "dans un champ"),
    ("at night", "in der Nacht", "la nuit"),
    ("under a tree", "unter einem Baum", "sous un arbre"),
]
ENDINGS = [
    ("", "", ""),
    (" with a friend", " mit einem Freund", " avec un ami"),
    (" while it is raining", " während es regnet", " pendant qu'il pleut"),
]


AND = ("and", "und", "et")


def sentences(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    """``n`` sentence triples (en, de, fr): one in eight two clauses long (length filters have work to do); about
    one in five without its final full stop, as in Multi30k."""
    out = []
    for _ in range(n):
        parts = [rng.choice(SUBJECTS), rng.choice(ACTIONS), rng.choice(PLACES)]
        if rng.random() < 0.125:
            other = rng.choice(SUBJECTS)
            parts += [AND, tuple(w[0].lower() + w[1:] for w in other), rng.choice(ACTIONS)]
        end = rng.choice(ENDINGS)
        stop = "." if rng.random() < 0.8 else ""
        out.append(tuple(" ".join(p[i] for p in parts) + end[i] + stop for i in range(len(LANGS))))
    return out


def write(folder: Path = HERE) -> list[Path]:
    """Every split's files in ``folder``; returns their paths."""
    rng = random.Random(SEED)
    written = []
    for split, n in SPLITS.items():
        triples = sentences(rng, n)
        for i, lang in enumerate(LANGS):
            path = folder / f"{split}.{lang}.gz"
            text = "".join(t[i] + "\n" for t in triples).encode("utf-8")
            with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
                f.write(text)
            written.append(path)
    return written


if __name__ == "__main__":
    for p in write():
        print(p)
