/** Tropa's version, as `tropa --version` and the traces' service.version show it. */
export const VERSION = '0.1.0'
