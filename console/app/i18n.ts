export type Lang = 'en' | 'ru'

const EN = {
  'app.title': 'Tropa console',
  'nav.overview': 'Overview',
  'nav.keys': 'Keys',
  'nav.activity': 'Activity',
  'nav.models': 'Models',
  'nav.orgs': 'Organizations',
  'nav.fleet': 'Fleet',
  'nav.main': 'Main',
  'lang.switch': 'Русский',
  'lang.switchLabel': 'Switch the language to Russian',
  'signin.title': 'Sign in',
  'signin.token': 'Master key or admin token',
  'signin.hint':
    'An organization signs in with its master key (mk-…), an operator with the admin token. The token is sent once and is not kept in the browser.',
  'signin.submit': 'Sign in',
  'signin.bad': 'This token is not valid: check it and try again.',
  'signin.apiKey': 'API keys (sk-…) cannot sign in: use the organization’s master key (mk-…).',
  signout: 'Sign out',
  'role.organization': 'Organization',
  'role.operator': 'Operator',
  'common.loading': 'Loading…',
  'common.none': '—',
  'common.save': 'Save',
  'common.cancel': 'Cancel',
  'common.error': 'Error',
  'common.refresh': 'Refresh',
  'common.copy': 'Copy',
  'common.copied': 'Copied',
  'common.name': 'Name',
  'common.created': 'Created',
  'common.status': 'Status',
  'common.actions': 'Actions',
  'common.next': 'Next page',
  'common.first': 'First page',
  'overview.balance': 'Balance',
  'overview.today': 'Spent today',
  'overview.month': 'Spent this month',
  'overview.requests': 'Requests this month',
  'overview.tokens': 'Tokens this month',
  'overview.chart': 'Spend and requests by model',
  'overview.range': 'Range',
  'overview.range.24h': 'Last 24 hours',
  'overview.range.7d': 'Last 7 days',
  'overview.range.30d': 'Last 30 days',
  'overview.spend': 'Spend, ₽',
  'overview.requestsAxis': 'Requests',
  'overview.total': 'All models',
  'overview.empty': 'No requests in this range yet.',
  'keys.create': 'Create a key',
  'keys.limit': 'Limit, ₽ (empty: none)',
  'keys.spent': 'Spent / limit',
  'keys.noLimit': 'no limit',
  'keys.lastUse': 'Last use',
  'keys.never': 'never',
  'keys.secretTitle': 'The new key',
  'keys.secretOnce': 'Copy it now: it is shown only once.',
  'keys.done': 'Done',
  'keys.edit': 'Edit',
  'keys.disable': 'Disable',
  'keys.enable': 'Enable',
  'keys.revoke': 'Revoke',
  'keys.revokeConfirm': 'Revoke {name}? Requests with it get 401 at once; this cannot be undone.',
  'keys.revokeYes': 'Yes, revoke',
  'keys.hint': 'Key',
  'status.active': 'active',
  'status.disabled': 'disabled',
  'status.revoked': 'revoked',
  'activity.time': 'Time',
  'activity.key': 'Key',
  'activity.model': 'Model',
  'activity.node': 'Node',
  'activity.tokens': 'Tokens (prompt / completion / cached)',
  'activity.cost': 'Cost',
  'activity.outcome': 'Outcome',
  'activity.duration': 'Duration / TTFT, ms',
  'activity.any': 'any',
  'activity.from': 'From',
  'activity.to': 'To',
  'activity.apply': 'Apply',
  'activity.csv': 'Download CSV',
  'activity.empty': 'No requests match.',
  'activity.filters': 'Filters',
  'models.id': 'Model',
  'models.owner': 'Owner',
  'models.context': 'Context, tokens',
  'models.prompt': 'Prompt, ₽ per 1M tokens',
  'models.completion': 'Completion, ₽ per 1M tokens',
  'orgs.create': 'Create an organization',
  'orgs.balance': 'Balance',
  'orgs.initial': 'Starting balance, ₽',
  'orgs.credit': 'Credit',
  'orgs.amount': 'Amount, ₽',
  'orgs.creditFor': 'Amount to credit to {name}, ₽',
  'orgs.masterTitle': 'The master key of {name}',
  'orgs.credited': 'Credited: the balance of {name} is {balance}.',
  'fleet.node': 'Node',
  'fleet.health': 'Health',
  'fleet.healthy': 'healthy',
  'fleet.ejected': 'ejected',
  'fleet.failing': 'failing',
  'fleet.inFlight': 'In flight',
  'fleet.prefill': 'Prefill, tok/s',
  'fleet.itl': 'ITL, ms',
  'fleet.rtt': 'RTT, ms',
  'fleet.ttft': 'TTFT p50 / p90 / p99, ms',
  'fleet.trend': 'TTFT p50 trend',
  'fleet.errors': 'Requests / failures',
  'fleet.updated': 'Updated every 2 s. Last: {time}',
}
export type Key = keyof typeof EN

const RU: Record<Key, string> = {
  'app.title': 'Консоль Tropa',
  'nav.overview': 'Обзор',
  'nav.keys': 'Ключи',
  'nav.activity': 'Запросы',
  'nav.models': 'Модели',
  'nav.orgs': 'Организации',
  'nav.fleet': 'Узлы',
  'nav.main': 'Главное',
  'lang.switch': 'English',
  'lang.switchLabel': 'Переключить язык на английский',
  'signin.title': 'Вход',
  'signin.token': 'Мастер-ключ или токен администратора',
  'signin.hint':
    'Организация входит со своим мастер-ключом (mk-…), оператор — с токеном администратора. Токен отправляется один раз и не хранится в браузере.',
  'signin.submit': 'Войти',
  'signin.bad': 'Неверный токен: проверьте его и попробуйте снова.',
  'signin.apiKey': 'С API-ключом (sk-…) войти нельзя: используйте мастер-ключ организации (mk-…).',
  signout: 'Выйти',
  'role.organization': 'Организация',
  'role.operator': 'Оператор',
  'common.loading': 'Загрузка…',
  'common.none': '—',
  'common.save': 'Сохранить',
  'common.cancel': 'Отмена',
  'common.error': 'Ошибка',
  'common.refresh': 'Обновить',
  'common.copy': 'Копировать',
  'common.copied': 'Скопировано',
  'common.name': 'Название',
  'common.created': 'Создан',
  'common.status': 'Статус',
  'common.actions': 'Действия',
  'common.next': 'Следующая страница',
  'common.first': 'Первая страница',
  'overview.balance': 'Баланс',
  'overview.today': 'Расход за сегодня',
  'overview.month': 'Расход за месяц',
  'overview.requests': 'Запросов за месяц',
  'overview.tokens': 'Токенов за месяц',
  'overview.chart': 'Расход и запросы по моделям',
  'overview.range': 'Период',
  'overview.range.24h': 'Последние 24 часа',
  'overview.range.7d': 'Последние 7 дней',
  'overview.range.30d': 'Последние 30 дней',
  'overview.spend': 'Расход, ₽',
  'overview.requestsAxis': 'Запросы',
  'overview.total': 'Все модели',
  'overview.empty': 'За этот период запросов нет.',
  'keys.create': 'Создать ключ',
  'keys.limit': 'Лимит, ₽ (пусто — без лимита)',
  'keys.spent': 'Потрачено / лимит',
  'keys.noLimit': 'без лимита',
  'keys.lastUse': 'Последнее использование',
  'keys.never': 'никогда',
  'keys.secretTitle': 'Новый ключ',
  'keys.secretOnce': 'Скопируйте его сейчас: он показывается только один раз.',
  'keys.done': 'Готово',
  'keys.edit': 'Изменить',
  'keys.disable': 'Отключить',
  'keys.enable': 'Включить',
  'keys.revoke': 'Отозвать',
  'keys.revokeConfirm': 'Отозвать {name}? Запросы с ним сразу получат 401; отменить это нельзя.',
  'keys.revokeYes': 'Да, отозвать',
  'keys.hint': 'Ключ',
  'status.active': 'активен',
  'status.disabled': 'отключён',
  'status.revoked': 'отозван',
  'activity.time': 'Время',
  'activity.key': 'Ключ',
  'activity.model': 'Модель',
  'activity.node': 'Узел',
  'activity.tokens': 'Токены (запрос / ответ / из кэша)',
  'activity.cost': 'Стоимость',
  'activity.outcome': 'Итог',
  'activity.duration': 'Длительность / TTFT, мс',
  'activity.any': 'любой',
  'activity.from': 'С',
  'activity.to': 'По',
  'activity.apply': 'Применить',
  'activity.csv': 'Скачать CSV',
  'activity.empty': 'Подходящих запросов нет.',
  'activity.filters': 'Фильтры',
  'models.id': 'Модель',
  'models.owner': 'Владелец',
  'models.context': 'Контекст, токенов',
  'models.prompt': 'Запрос, ₽ за 1 млн токенов',
  'models.completion': 'Ответ, ₽ за 1 млн токенов',
  'orgs.create': 'Создать организацию',
  'orgs.balance': 'Баланс',
  'orgs.initial': 'Начальный баланс, ₽',
  'orgs.credit': 'Пополнить',
  'orgs.amount': 'Сумма, ₽',
  'orgs.creditFor': 'Сумма пополнения для {name}, ₽',
  'orgs.masterTitle': 'Мастер-ключ организации {name}',
  'orgs.credited': 'Пополнено: баланс {name} — {balance}.',
  'fleet.node': 'Узел',
  'fleet.health': 'Состояние',
  'fleet.healthy': 'в порядке',
  'fleet.ejected': 'исключён',
  'fleet.failing': 'ошибки',
  'fleet.inFlight': 'В работе',
  'fleet.prefill': 'Prefill, ток/с',
  'fleet.itl': 'ITL, мс',
  'fleet.rtt': 'RTT, мс',
  'fleet.ttft': 'TTFT p50 / p90 / p99, мс',
  'fleet.trend': 'Динамика TTFT p50',
  'fleet.errors': 'Запросы / сбои',
  'fleet.updated': 'Обновляется каждые 2 с. Последнее: {time}',
}

const saved = (() => {
  try {
    return localStorage.getItem('tropa.lang')
  } catch {
    return null
  }
})()
/** The reader's language: their choice, else the browser's. */
export const lang: { value: Lang } = {
  value:
    saved === 'ru' || saved === 'en'
      ? saved
      : navigator.language.toLowerCase().startsWith('ru')
        ? 'ru'
        : 'en',
}

export function setLang(l: Lang): void {
  lang.value = l
  document.documentElement.lang = l
  dispatchEvent(new Event('tropa-lang'))
  try {
    localStorage.setItem('tropa.lang', l)
  } catch {
    // storage refused (private mode): the choice lasts for this page only
  }
}

export function t(key: Key, vars: Record<string, string> = {}): string {
  const text = (lang.value === 'ru' ? RU : EN)[key]
  return text.replace(/\{(\w+)\}/g, (_, k: string) => vars[k] ?? '')
}

const locale = () => (lang.value === 'ru' ? 'ru-RU' : 'en-US')

/** Roubles in the reader's locale: `1 234,56 ₽` in Russian, `₽1,234.56` in English. */
export function rub(n: number | null | undefined, digits = 2): string {
  if (n === null || n === undefined) return t('common.none')
  return new Intl.NumberFormat(locale(), {
    style: 'currency',
    currency: 'RUB',
    currencyDisplay: 'narrowSymbol',
    minimumFractionDigits: digits,
    maximumFractionDigits: Math.max(digits, n !== 0 && Math.abs(n) < 0.01 ? 6 : digits),
  }).format(n)
}

export function num(n: number | null | undefined, digits = 0): string {
  if (n === null || n === undefined) return t('common.none')
  return new Intl.NumberFormat(locale(), { maximumFractionDigits: digits }).format(n)
}

/** A Unix time (seconds) in the browser's time zone. */
export function when(sec: number | null | undefined): string {
  if (sec === null || sec === undefined) return t('common.none')
  return new Intl.DateTimeFormat(locale(), { dateStyle: 'medium', timeStyle: 'medium' }).format(sec * 1000)
}
