"""Closed-book prompts for taskheads' specificity control: short plain-text prompts a small model
completes with no context ("The capital of France is" -> Paris), and a separate reference set of
the same kinds whose heads' mean a mean ablation puts in (never evaluated).

Why a few hundred: the control keeps only the prompts the full model answers, and with the first
24 prompts SmolLM2-135M kept 11 and Gemma 3 270M 14, so one lost prompt was 7-9 points and the
done-when's "at most 5 points" could only read "no prompt lost", with no standard error. The set
grew (before any ablation on it) to kinds both small models answer: sequences, capitals,
opposites, pairs and sayings, plurals and past tenses, word sums, everyday facts, languages;
the forms that neither model completed on a first check ("The plural of mouse is": "a cat",
"mouse"; "The past tense of go is": "a verb") were rephrased, and capitals are asked both ways
(each model completes one), before any ablation. Each kind's
items are dealt in turn to the evaluated set and to the reference set (even places evaluated, odd
reference), so both hold the same kinds in the same shares; the first 24 of each are the original
lists, unchanged.
"""

from __future__ import annotations

# The original 24 evaluated prompts and 24 reference prompts (kept first, as they were).
ORIGINAL = [
    ("The capital of France is", "Paris"),
    ("The capital of Italy is", "Rome"),
    ("The capital of Japan is", "Tokyo"),
    ("The capital of Germany is", "Berlin"),
    ("The capital of Spain is", "Madrid"),
    ("The capital of England is", "London"),
    ("Monday, Tuesday, Wednesday,", "Thursday"),
    ("January, February, March,", "April"),
    ("one, two, three, four,", "five"),
    ("The opposite of hot is", "cold"),
    ("The opposite of up is", "down"),
    ("The opposite of black is", "white"),
    ("Water freezes at zero degrees", "Celsius"),
    ("The sun rises in the", "east"),
    ("A week has seven", "days"),
    ("The chemical symbol for water is", "H"),
    ("Cats and", "dogs"),
    ("Romeo and", "Juliet"),
    ("Salt and", "pepper"),
    ("The largest planet in the solar system is", "Jupiter"),
    ("The color of the sky on a clear day is", "blue"),
    ("Bread is made from", "flour"),
    ("The first letter of the alphabet is", "A"),
    ("Ten plus ten equals", "twenty"),
]
ORIGINAL_REFERENCE = [
    ("The capital of Russia is", "Moscow"),
    ("The capital of Egypt is", "Cairo"),
    ("The capital of Greece is", "Athens"),
    ("The capital of Canada is", "Ottawa"),
    ("Friday, Saturday,", "Sunday"),
    ("June, July, August,", "September"),
    ("six, seven, eight,", "nine"),
    ("The opposite of left is", "right"),
    ("The opposite of day is", "night"),
    ("The opposite of big is", "small"),
    ("Water boils at one hundred degrees", "Celsius"),
    ("The sun sets in the", "west"),
    ("A year has twelve", "months"),
    ("The chemical symbol for gold is", "Au"),
    ("Bread and", "butter"),
    ("Rock and", "roll"),
    ("The closest star to the Earth is the", "Sun"),
    ("The color of grass is", "green"),
    ("Cheese is made from", "milk"),
    ("The last letter of the alphabet is", "Z"),
    ("Two plus two equals", "four"),
    ("A triangle has three", "sides"),
    ("The Earth orbits the", "Sun"),
    ("Ice is frozen", "water"),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]  # fmt: skip
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen", "twenty"]  # fmt: skip
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
            "ninth", "tenth"]  # fmt: skip


def _runs(items: list[str], length: int, wrap: bool) -> list[tuple[str, str]]:
    """Every run of ``length`` consecutive items, as "a, b, c," -> the next item."""
    n = len(items)
    last = n if wrap else n - length
    return [(", ".join(items[(i + j) % n] for j in range(length)) + ",", items[(i + length) % n])
            for i in range(last)]  # fmt: skip


CAPITALS = [
    ("China", "Beijing"), ("India", "New Delhi"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
    ("Austria", "Vienna"), ("Hungary", "Budapest"), ("Poland", "Warsaw"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"),
    ("Netherlands", "Amsterdam"), ("Belgium", "Brussels"), ("Scotland", "Edinburgh"),
    ("Czech Republic", "Prague"), ("Turkey", "Ankara"), ("Iran", "Tehran"),
    ("Iraq", "Baghdad"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"),
    ("South Korea", "Seoul"), ("North Korea", "Pyongyang"), ("Indonesia", "Jakarta"),
    ("Philippines", "Manila"), ("Kenya", "Nairobi"), ("Argentina", "Buenos Aires"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Cuba", "Havana"), ("Mexico", "Mexico City"),
    ("Romania", "Bucharest"), ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"),
    ("Lebanon", "Beirut"), ("Syria", "Damascus"), ("Afghanistan", "Kabul"),
    ("Pakistan", "Islamabad"), ("Bangladesh", "Dhaka"), ("Nepal", "Kathmandu"),
    ("Ethiopia", "Addis Ababa"), ("Iceland", "Reykjavik"), ("Wales", "Cardiff"),
    ("United States", "Washington"), ("Malaysia", "Kuala Lumpur"), ("Taiwan", "Taipei"),
    ("Venezuela", "Caracas"), ("New Zealand", "Wellington"), ("Libya", "Tripoli"),
    ("Ghana", "Accra"), ("Uganda", "Kampala"), ("Latvia", "Riga"), ("Lithuania", "Vilnius"),
    ("Estonia", "Tallinn"), ("Jordan", "Amman"), ("Qatar", "Doha"), ("Georgia", "Tbilisi"),
    ("Armenia", "Yerevan"), ("Azerbaijan", "Baku"), ("Sri Lanka", "Colombo"),
    ("Cambodia", "Phnom Penh"), ("Saudi Arabia", "Riyadh"), ("Nigeria", "Abuja"),
    ("Morocco", "Rabat"), ("Croatia", "Zagreb"), ("Slovakia", "Bratislava"),
    ("Zimbabwe", "Harare"), ("Sudan", "Khartoum"), ("Tunisia", "Tunis"),
    ("Australia", "Canberra"), ("Switzerland", "Bern"),
]  # fmt: skip

OPPOSITES = [
    ("tall", "short"), ("fast", "slow"), ("happy", "sad"), ("open", "closed"), ("wet", "dry"),
    ("hard", "soft"), ("light", "dark"), ("good", "bad"), ("rich", "poor"), ("strong", "weak"),
    ("high", "low"), ("early", "late"), ("full", "empty"), ("in", "out"), ("yes", "no"),
    ("love", "hate"), ("win", "lose"), ("push", "pull"), ("true", "false"),
    ("inside", "outside"), ("before", "after"), ("above", "below"), ("first", "last"),
    ("north", "south"), ("east", "west"), ("man", "woman"), ("boy", "girl"), ("king", "queen"),
    ("buy", "sell"), ("question", "answer"), ("war", "peace"), ("friend", "enemy"),
    ("clean", "dirty"), ("thick", "thin"), ("near", "far"), ("top", "bottom"),
    ("front", "back"), ("alive", "dead"), ("loud", "quiet"), ("cheap", "expensive"),
    ("always", "never"), ("remember", "forget"), ("increase", "decrease"),
    ("positive", "negative"), ("maximum", "minimum"), ("come", "go"), ("more", "less"),
    ("plus", "minus"), ("success", "failure"), ("wide", "narrow"), ("deep", "shallow"),
    ("old", "new"), ("heavy", "light"), ("sweet", "sour"), ("start", "finish"),
    ("laugh", "cry"), ("arrive", "leave"), ("awake", "asleep"), ("give", "take"),
    ("import", "export"),
]  # fmt: skip

SAYINGS = [
    ("Peanut butter and", "jelly"), ("Fish and", "chips"), ("Ladies and", "gentlemen"),
    ("Thunder and", "lightning"), ("Bow and", "arrow"), ("Knife and", "fork"),
    ("Jack and", "Jill"), ("Adam and", "Eve"), ("Beauty and the", "Beast"), ("Tom and", "Jerry"),
    ("Batman and", "Robin"), ("Bonnie and", "Clyde"), ("Hansel and", "Gretel"),
    ("Hide and", "seek"), ("Trial and", "error"), ("Supply and", "demand"),
    ("Pros and", "cons"), ("Back and", "forth"), ("Sooner or", "later"), ("Now or", "never"),
    ("Sink or", "swim"), ("Yin and", "yang"), ("Law and", "order"), ("Lock and", "key"),
    ("Needle and", "thread"), ("Bacon and", "eggs"), ("Trick or", "treat"),
    ("Rock, paper,", "scissors"), ("Ready, set,", "go"), ("Once upon a", "time"),
    ("Happy birthday to", "you"), ("Twinkle, twinkle, little", "star"),
    ("Mary had a little", "lamb"), ("An apple a day keeps the doctor", "away"),
    ("Better late than", "never"), ("Actions speak louder than", "words"),
    ("The early bird catches the", "worm"), ("Practice makes", "perfect"),
    ("Knowledge is", "power"), ("To be or not to", "be"), ("Rome was not built in a", "day"),
    ("Curiosity killed the", "cat"), ("A picture is worth a thousand", "words"),
    ("Two wrongs don't make a", "right"), ("Where there's smoke, there's", "fire"),
    ("Laughter is the best", "medicine"), ("Honesty is the best", "policy"),
    ("Look before you", "leap"), ("Birds of a feather flock", "together"),
    ("Every cloud has a silver", "lining"), ("Easy come, easy", "go"),
    ("Out of sight, out of", "mind"), ("No pain, no", "gain"),
    ("The pen is mightier than the", "sword"), ("Home sweet", "home"),
    ("Merry Christmas and a happy new", "year"), ("Cause and", "effect"),
    ("Heaven and", "hell"), ("Life and", "death"), ("Cops and", "robbers"),
]  # fmt: skip

PLURALS = [
    ("mouse", "mice"), ("child", "children"), ("man", "men"), ("woman", "women"),
    ("foot", "feet"), ("tooth", "teeth"), ("goose", "geese"), ("person", "people"),
    ("cat", "cats"), ("box", "boxes"), ("baby", "babies"), ("knife", "knives"),
    ("leaf", "leaves"), ("wolf", "wolves"), ("sheep", "sheep"), ("ox", "oxen"),
    ("city", "cities"), ("dog", "dogs"), ("book", "books"), ("bus", "buses"),
    ("potato", "potatoes"), ("life", "lives"), ("wife", "wives"), ("half", "halves"),
    ("church", "churches"), ("glass", "glasses"), ("story", "stories"), ("day", "days"),
]  # fmt: skip

PAST = [
    ("go", "went"), ("eat", "ate"), ("see", "saw"), ("run", "ran"), ("take", "took"),
    ("write", "wrote"), ("sing", "sang"), ("swim", "swam"), ("drink", "drank"), ("buy", "bought"),
    ("think", "thought"), ("teach", "taught"), ("catch", "caught"), ("bring", "brought"),
    ("give", "gave"), ("come", "came"), ("speak", "spoke"), ("break", "broke"),
    ("drive", "drove"), ("fly", "flew"), ("know", "knew"), ("throw", "threw"), ("grow", "grew"),
    ("sleep", "slept"), ("make", "made"), ("say", "said"), ("fall", "fell"),
    ("begin", "began"), ("choose", "chose"), ("forget", "forgot"),
]  # fmt: skip

SUMS = [
    ("One plus one", "two"), ("Two plus three", "five"), ("Three plus three", "six"),
    ("Four plus four", "eight"), ("Five plus five", "ten"), ("Six plus one", "seven"),
    ("Two times three", "six"), ("Ten minus five", "five"), ("Three plus four", "seven"),
    ("Two times five", "ten"), ("Nine minus three", "six"), ("Four plus five", "nine"),
    ("One plus two", "three"), ("Eight minus four", "four"), ("Two times two", "four"),
    ("Six plus six", "twelve"), ("Seven plus one", "eight"), ("Five plus four", "nine"),
    ("Ten minus one", "nine"), ("Three times three", "nine"),
]  # fmt: skip

FACTS = [
    ("The largest ocean on Earth is the", "Pacific"),
    ("The tallest mountain in the world is Mount", "Everest"),
    ("The longest river in Africa is the", "Nile"),
    ("The planet closest to the Sun is", "Mercury"),
    ("The red planet is", "Mars"),
    ("The first man on the moon was Neil", "Armstrong"),
    ("Romeo and Juliet was written by William", "Shakespeare"),
    ("The Mona Lisa was painted by Leonardo da", "Vinci"),
    ("The theory of relativity was developed by Albert", "Einstein"),
    ("The first president of the United States was George", "Washington"),
    ("The currency of Japan is the", "yen"),
    ("The currency of the United States is the", "dollar"),
    ("The largest continent is", "Asia"),
    ("A baby cat is called a", "kitten"),
    ("A baby dog is called a", "puppy"),
    ("A baby cow is called a", "calf"),
    ("A baby sheep is called a", "lamb"),
    ("A spider has eight", "legs"),
    ("An insect has six", "legs"),
    ("A square has four", "sides"),
    ("A hexagon has six", "sides"),
    ("An octagon has eight", "sides"),
    ("A day has twenty-four", "hours"),
    ("An hour has sixty", "minutes"),
    ("A minute has sixty", "seconds"),
    ("A century is one hundred", "years"),
    ("A dozen is", "twelve"),
    ("The color of a banana is", "yellow"),
    ("The color of snow is", "white"),
    ("The color of blood is", "red"),
    ("The color of coal is", "black"),
    ("The color of a lemon is", "yellow"),
    ("Cows give us", "milk"),
    ("Bees make", "honey"),
    ("Hens lay", "eggs"),
    ("The king of the jungle is the", "lion"),
    ("The largest animal in the world is the blue", "whale"),
    ("The fastest land animal is the", "cheetah"),
    ("Spiders spin", "webs"),
    ("Fish live in", "water"),
    ("We see with our", "eyes"),
    ("We hear with our", "ears"),
    ("We smell with our", "nose"),
    ("The heart pumps", "blood"),
    ("Doctors work in a", "hospital"),
    ("Teachers work in a", "school"),
    ("Books are kept in a", "library"),
    ("We sleep in a", "bed"),
    ("Sushi comes from", "Japan"),
    ("The Eiffel Tower is in", "Paris"),
    ("The Statue of Liberty is in New", "York"),
    ("The Great Wall is in", "China"),
    ("The Colosseum is in", "Rome"),
    ("Big Ben is in", "London"),
    ("The pyramids are in", "Egypt"),
    ("The Taj Mahal is in", "India"),
    ("Mount Fuji is in", "Japan"),
    ("Christmas is in", "December"),
    ("Halloween is in", "October"),
    ("There are seven days in a", "week"),
    ("There are twelve months in a", "year"),
    ("Humans breathe in", "oxygen"),
    ("Pizza comes from", "Italy"),
]

LANGUAGES = [
    ("Spain", "Spanish"), ("Italy", "Italian"), ("Japan", "Japanese"), ("Russia", "Russian"),
    ("Greece", "Greek"), ("Portugal", "Portuguese"), ("Germany", "German"), ("France", "French"),
    ("Brazil", "Portuguese"), ("Mexico", "Spanish"), ("Egypt", "Arabic"), ("Sweden", "Swedish"),
    ("Poland", "Polish"), ("Turkey", "Turkish"), ("Korea", "Korean"),
    ("the Netherlands", "Dutch"), ("England", "English"), ("Finland", "Finnish"),
]  # fmt: skip

# Each kind by name (the names label the benchmark's counts per kind).
KINDS: dict[str, list[tuple[str, str]]] = {
    "days": _runs(DAYS, 3, wrap=True),
    "months": _runs(MONTHS, 3, wrap=True),
    "number words": _runs(NUMBERS, 3, wrap=False),
    "letters": _runs([chr(ord("A") + i) for i in range(26)], 3, wrap=False),
    "numbers": _runs([str(i) for i in range(1, 31)], 3, wrap=False),
    "tens": _runs([str(10 * i) for i in range(1, 11)], 3, wrap=False),
    "ordinals": _runs(ORDINALS, 3, wrap=False),
    # both ways: SmolLM2-135M completes "The capital of X is" (and "CITY is the capital of"
    # with "the island of ..."), Gemma 3 270M the other ("the capital of the ...")
    "capitals": [(f"The capital of {c} is", a) for c, a in CAPITALS],
    "capitals (city first)": [(f"{a} is the capital of", c) for c, a in CAPITALS],
    "opposites": [(f"The opposite of {w} is", a) for w, a in OPPOSITES],
    "sayings": SAYINGS,
    "plurals": [(f"one {w}, two", a) for w, a in PLURALS],
    "past tense": [(f"Today I {w}. Yesterday I", a) for w, a in PAST],
    "word sums": [(f"{s} equals", a) for s, a in SUMS],
    "facts": FACTS,
    "languages": [(f"People in {c} speak", a) for c, a in LANGUAGES],
}


def _deal() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Each kind's items in turn to the evaluated set (even places) and the reference set (odd),
    after the original lists; a prompt already in either set is skipped."""
    evaluated, reference = list(ORIGINAL), list(ORIGINAL_REFERENCE)
    seen = {p for p, _ in evaluated + reference}
    for kind in KINDS.values():
        fresh = [(p, a) for p, a in kind if p not in seen]
        seen.update(p for p, _ in fresh)
        evaluated += fresh[0::2]
        reference += fresh[1::2]
    return evaluated, reference


CLOSED_BOOK, CLOSED_BOOK_REFERENCE = _deal()
