# ruff: noqa: E501  (a table of sentences: one topic's line reads better whole)
"""A labelled paraphrase set for search by meaning (issue 40), generated: queries that say what a stored message
says with no word of it, in English, Chinese and Japanese, among distractors.

Each topic has one stored message per language and three ways to ask for it per language, written so that no
word is shared: for English, no word (case folded; "a", "the", "on"... aside: STOPWORDS); for Chinese and Japanese, which put no spaces between words,
no two characters in a row (most of their words are two characters or more). ``shared_words`` checks it and the
tests assert it. Each core query is asked as it is and inside framings ("what did I say about ..."), also
checked: 30 topics x 3 languages x 3 cores x 2 forms = 540 queries. Each language's queries search the history
of a user who speaks it: its 30 targets among 432 distractors and filler of other subjects in all three.
"""

from __future__ import annotations

import itertools
import re

# (English message, English queries), (Chinese ...), (Japanese ...)
TOPICS: list[tuple[tuple[str, tuple[str, str, str]], ...]] = [
    (("I booked a flight to Beijing for next Tuesday", ("airplane ticket", "plane reservation", "air travel plans")),
     ("我订了下周二去北京的机票", ("航班预约", "坐飞机出行", "航空旅程安排")),
     ("来週の火曜日に北京行きの航空券を予約した", ("フライトの手配", "飛行機の旅", "空の便"))),
    (("My dog has been sick and vomiting all night", ("pet illness", "puppy unwell", "animal health problem")),
     ("我的狗整晚都在呕吐，病得很厉害", ("宠物不舒服", "小动物身体欠佳", "爱犬健康状况")),
     ("うちの犬が一晩中吐いていて具合が悪い", ("ペットの体調不良", "愛犬の病気", "動物が衰弱中"))),
    (("Remind me to pay the electricity bill on Friday", ("power invoice payment", "utility charges due", "energy costs")),
     ("提醒我周五交电费", ("付电力账单", "水电煤缴纳", "能源开销")),
     ("金曜日に電気代を払うのを忘れないで", ("光熱費の支払い", "電力料金", "エネルギーの請求書"))),
    (("I have a dentist appointment tomorrow morning", ("tooth doctor visit", "dental checkup", "teeth cleaning")),
     ("我明天上午要去看牙医", ("口腔检查", "补牙预约", "齿科就诊")),
     ("明日の午前中に歯医者の予約がある", ("歯科検診", "虫歯の治療", "デンタルクリニック"))),
    (("My laptop screen cracked when it fell off the desk", ("computer display broken", "notebook monitor damaged", "PC panel shattered")),
     ("笔记本电脑从桌上掉下来，屏幕摔裂了", ("显示器坏掉", "手提计算机损坏", "荧幕碎了")),
     ("ノートパソコンが机から落ちて画面が割れた", ("ディスプレイ故障", "モニターの破損", "液晶がひび"))),
    (("We are getting married in June at the beach", ("wedding ceremony", "marriage by the sea", "bride and groom plans")),
     ("我们六月要在海边举行婚礼", ("结婚典礼", "新娘新郎", "喜宴筹备")),
     ("六月に海辺で結婚式を挙げる予定です", ("ウェディング", "挙式の準備", "花嫁と花婿"))),
    (("The car makes a strange noise when I brake", ("vehicle squeaking sound", "automobile repair", "odd sound while stopping")),
     ("我踩刹车的时候汽车有奇怪的响声", ("车辆异响", "修理轿车", "制动系统故障")),
     ("ブレーキを踏むと車から変な音がする", ("自動車の異音", "クルマの修理", "制動装置の不具合"))),
    (("I want to learn to play the guitar this year", ("music lessons", "strumming an instrument", "taking up a string instrument")),
     ("我今年想学弹吉他", ("乐器课程", "练习弹奏", "音乐培训")),
     ("今年はギターを弾けるようになりたい", ("楽器の練習", "音楽教室", "弦を奏でる"))),
    (("My rent is going up by two hundred dollars", ("apartment cost increase", "housing payment higher", "landlord raising charges")),
     ("我的房租要涨两百块", ("住房开销增加", "公寓费用上调", "房东提价")),
     ("家賃が二百ドル上がる", ("住居費の値上げ", "アパート代が高く", "大家さんの値上げ"))),
    (("I lost my wallet on the subway this morning", ("purse missing", "misplaced billfold on the train", "credit cards gone")),
     ("今早在地铁上丢了钱包", ("皮夹不见", "遗失财物", "证件和银行卡没了")),
     ("今朝、地下鉄で財布をなくした", ("紛失物", "カード類が見つからない", "落とし物"))),
    (("Our team won the basketball game last night", ("sports victory", "hoops match result", "championship triumph")),
     ("昨晚我们队赢了篮球比赛", ("体育胜利", "球赛结果", "夺冠喜讯")),
     ("昨夜うちのチームがバスケの試合に勝った", ("スポーツの勝利", "優勝の知らせ", "勝負の結末"))),
    (("I need a recipe for chocolate cake", ("baking a dessert", "sweet pastry instructions", "how to make a gateau")),
     ("我需要巧克力蛋糕的做法", ("烘焙甜点", "西点食谱", "制作糕点")),
     ("チョコレートケーキの作り方が知りたい", ("お菓子づくり", "スイーツの調理法", "焼き菓子"))),
    (("My grandmother is in the hospital", ("grandma admitted to a clinic", "elderly relative receiving treatment", "family member ward")),
     ("我奶奶住院了", ("老人家接受治疗", "长辈病房", "家人就医")),
     ("祖母が入院している", ("おばあちゃんの治療", "家族の病状", "高齢の親族が病棟に"))),
    (("The printer at the office is out of ink again", ("cartridge empty", "toner needs replacing", "copier supplies")),
     ("办公室的打印机又没墨了", ("墨盒用完", "更换碳粉", "复印耗材")),
     ("会社のプリンターがまたインク切れだ", ("カートリッジ交換", "トナー不足", "コピー機の消耗品"))),
    (("I am moving to a new apartment in Shanghai next month", ("relocating house", "changing residence", "packing boxes for a new home")),
     ("我下个月要搬到上海的新公寓", ("乔迁新居", "更换住所", "打包行李换房子")),
     ("来月、上海の新しいアパートに引っ越す", ("転居の準備", "住まいを変える", "荷造り"))),
    (("My phone battery drains very fast", ("mobile power runs out quickly", "cell charge drops", "handset needs charging often")),
     ("我的手机电池掉电很快", ("电量消耗", "充电频繁", "续航太差")),
     ("スマホのバッテリーがすぐ減る", ("電池の持ちが悪い", "充電がもたない", "携帯の電源切れ"))),
    (("We adopted a kitten from the shelter", ("new cat at home", "rescued feline", "took in a small pet")),
     ("我们从收容所领养了一只小猫", ("家里多了宠物", "救助喵星人", "开始饲养猫咪")),
     ("保護施設から子猫を引き取った", ("新しいペット", "ねこを飼い始めた", "譲渡された動物"))),
    (("The heating in the building stopped working", ("radiator broken", "no warmth indoors", "furnace failure")),
     ("楼里的暖气坏了", ("供热故障", "室内很冷", "锅炉停止")),
     ("建物の暖房が止まった", ("ヒーターの故障", "部屋が寒い", "ボイラーの不具合"))),
    (("I passed my driving test today", ("got a license", "road exam success", "allowed behind the wheel")),
     ("我今天通过了驾照考试", ("拿到驾驶执照", "路考合格", "可以开车了")),
     ("今日、運転免許の試験に合格した", ("ドライバーライセンス取得", "路上テスト通過", "クルマに乗れるようになった"))),
    (("My knee hurts after running", ("joint pain from jogging", "leg ache", "injury from exercise")),
     ("跑步之后膝盖疼", ("关节不适", "腿部酸痛", "运动受伤")),
     ("走った後にひざが痛む", ("関節痛", "脚の故障", "運動によるけが"))),
    (("Please translate this contract into French", ("legal document in another language", "agreement conversion", "paperwork interpretation")),
     ("请把这份合同翻译成法语", ("协议文件外文版本", "法律文书转换", "条款译文")),
     ("この契約書をフランス語に訳してください", ("書類の翻訳", "法的文書", "合意文書の外国語版"))),
    (("The meeting with the client moved to Thursday", ("customer call rescheduled", "appointment postponed", "business session shifted")),
     ("和客户的会议改到周四了", ("商务洽谈延期", "约见时间调整", "会面推迟")),
     ("顧客との打ち合わせが木曜日に変更になった", ("ミーティングの延期", "商談の日程", "アポのずれ"))),
    (("I forgot my password and cannot log in", ("account access locked out", "sign-in credentials lost", "reset login")),
     ("我忘了密码，登录不上", ("账号无法进入", "找回口令", "重置账户")),
     ("パスワードを忘れてログインできない", ("アカウントに入れず困る", "認証情報の再設定", "認証のトラブル"))),
    (("It is going to snow heavily this weekend", ("winter storm forecast", "blizzard expected", "cold flurries coming")),
     ("这个周末会下大雪", ("暴风雪预报", "寒潮来袭", "天气预警")),
     ("今週末は大雪になるらしい", ("吹雪の予報", "寒波の到来", "天気の警報"))),
    (("My son starts kindergarten in September", ("child beginning preschool", "kid's first school year", "nursery enrollment")),
     ("我儿子九月开始上幼儿园", ("孩子入学", "学前教育报名", "小朋友读书")),
     ("息子が九月から幼稚園に通い始める", ("子どもの入園", "保育所への入学", "就学前教育"))),
    (("The coffee machine in the kitchen leaks water", ("espresso maker dripping", "brewer puddle", "appliance leaking")),
     ("厨房的咖啡机漏水", ("意式浓缩机滴水", "电器渗液", "台面积水")),
     ("台所のコーヒーメーカーから水が漏れる", ("エスプレッソ機の故障", "家電の故障でびしょびしょ", "床が濡れている"))),
    (("I got promoted to senior engineer", ("career advancement", "new job title", "raise and higher position")),
     ("我升职为高级工程师了", ("职业晋升", "职位提高", "加薪升迁")),
     ("シニアエンジニアに昇進した", ("キャリアアップ", "役職が上がった", "出世"))),
    (("My flight was cancelled because of the storm", ("trip called off due to weather", "airline disruption", "grounded plane")),
     ("因为暴风雨我的航班被取消了", ("行程受天气影响", "航空公司停飞", "飞机停运")),
     ("嵐のせいで飛行機が欠航になった", ("天候による運休", "便が飛ばない", "旅行が中止"))),
    (("I am allergic to peanuts", ("nut sensitivity", "food reaction", "cannot eat groundnuts")),
     ("我对花生过敏", ("坚果不耐受", "食物敏感", "吃了会起疹子")),
     ("ピーナッツアレルギーがある", ("豆類で体調を崩す", "食物の過敏症", "体質的に合わない食品"))),
    (("The package I ordered never arrived", ("delivery missing", "parcel lost in shipping", "mail not received")),
     ("我订购的包裹一直没到", ("快递丢失", "物流延误", "没收到邮件")),
     ("注文した荷物が届かない", ("配達の遅れ", "宅配便の紛失", "郵便の未着"))),
]

FRAMES = {
    "en": ("what did we say about {}", "remember the {} thing"),
    "zh": ("之前聊过{}吗", "关于{}那件事"),
    "ja": ("{}の話、覚えてる？", "あの{}の件"),
}
DISTRACTORS = {
    "en": ["The museum opens at nine on weekdays", "Can you summarize this article for me", "Thanks, that helps a lot",
           "Let's talk about history of Rome", "Which programming language should I learn first",
           "The garden tomatoes are ripe", "How many ounces are in a pound", "Good night, talk tomorrow",
           "Tell me a joke about penguins", "The quarterly report is attached", "Sort this list alphabetically",
           "What is the capital of Australia"],
    "zh": ["博物馆工作日九点开门", "帮我总结一下这篇文章", "谢谢，很有帮助", "聊聊罗马的历史", "先学哪种编程语言好",
           "花园里的西红柿熟了", "一斤等于多少克", "晚安，明天聊", "讲个企鹅的笑话", "季度报告在附件里", "把这个列表按字母排序",
           "澳大利亚的首都是哪里"],
    "ja": ["博物館は平日九時に開く", "この記事を要約して", "ありがとう、助かりました", "ローマの歴史について話そう",
           "最初に学ぶべきプログラミング言語は", "庭のトマトが熟した", "一ポンドは何オンス", "おやすみ、また明日",
           "ペンギンの冗談を言って", "四半期報告書を添付します", "このリストを並べ替えて", "オーストラリアの首都はどこ"],
}
LANGUAGES = ("en", "zh", "ja")
# English words that carry no subject: sharing one is not sharing a word (keyword search finds nothing by them)
STOPWORDS = {"a", "an", "the", "on", "in", "at", "to", "for", "of", "by", "we", "i", "my", "is", "and", "new"}


def shared_words(message: str, query: str, language: str) -> set[str]:
    """The words (English) or two-character runs (Chinese, Japanese) a query shares with its message."""
    if language == "en":
        words = [set(re.findall(r"[a-z0-9']+", s.lower())) - STOPWORDS for s in (message, query)]
        return words[0] & words[1]
    grams = [{s[i : i + 2] for i in range(len(s) - 1)} for s in (re.sub(r"\W", "", message), re.sub(r"\W", "", query))]
    return grams[0] & grams[1]


def history(language: str) -> list[tuple[str, str]]:
    """(key, text) of every message of the user who speaks ``language``: the 30 targets in that language (each
    subject once: a translation of a target would be a second right answer), then the distractors and filler
    (two distractors joined) of all three languages."""
    i = LANGUAGES.index(language)
    rows = [(f"{language}-{t}", topic[i][0]) for t, topic in enumerate(TOPICS)]
    for lang in LANGUAGES:
        rows += [(f"d-{lang}-{i}", d) for i, d in enumerate(DISTRACTORS[lang])]
        pairs = itertools.permutations(DISTRACTORS[lang], 2)
        rows += [(f"f-{lang}-{i}", f"{a} {b}" if lang == "en" else a + "。" + b) for i, (a, b) in enumerate(pairs)]
    return rows


def queries() -> list[tuple[str, str, str]]:
    """(language, query, the key of the message it asks for)."""
    out = []
    for t, topic in enumerate(TOPICS):
        for i, lang in enumerate(LANGUAGES):
            for core in topic[i][1]:
                out += [(lang, core, f"{lang}-{t}")]
                out += [(lang, FRAMES[lang][(t + len(core)) % 2].format(core), f"{lang}-{t}")]
    return out
