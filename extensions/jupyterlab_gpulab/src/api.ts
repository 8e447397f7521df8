// Calls to this server's gpulab API (the server extension), which talks to the hub and billing.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IBalance, ICatalog, IPool, IServerId, IStatus } from './logic';
import { IGpuUnavailable, IGpuUsage } from './gpuusage';
import { ISpotStatus } from './spot';
import { IStorage } from './storage';

export class ApiError extends Error {
  /** `answered`: this server's extension answered (a JSON message), not a proxy error page. */
  constructor(
    readonly status: number,
    message: string,
    readonly answered: boolean
  ) {
    super(message);
  }
}

const settings = ServerConnection.makeSettings();

export function apiUrl(path: string): string {
  return URLExt.join(settings.baseUrl, 'gpulab', 'api', path);
}

export async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const response = await ServerConnection.makeRequest(
    apiUrl(path),
    { cache: 'no-store', ...init },
    settings
  );
  let data: any = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const answered = !!data && typeof data.message === 'string';
    // A refusal's plain sentence (`human`) is what a person reads; `message` names API fields.
    const human = answered && typeof data.human === 'string' && data.human ? data.human : '';
    const message = answered ? human || data.message : `HTTP ${response.status} from ${path}`;
    throw new ApiError(response.status, message, answered);
  }
  return data as T;
}

export const getStatus = () => request<IStatus>('status');
export const getBalance = () => request<IBalance>('balance');
export const getCatalog = () => request<ICatalog>('catalog');
export const getPool = () => request<IPool>('pool');
/** This server's cards as the hub measures them, or {available: false} when the hub cannot say. */
export const getGpuUsage = () => request<IGpuUsage | IGpuUnavailable>('gpu-usage');
export const getSpot = () => request<ISpotStatus>('spot');
/** The hub's figure of this user's home, or {available: false} when the hub cannot say. */
export const getStorage = () =>
  request<IStorage | { available: false; message: string }>('storage');

export interface INotice {
  kind: string;
  message: string;
  t: number;
}
export const getNotices = () => request<{ notices: INotice[] }>('notices');

export interface ISwitchRequest {
  gpu?: string;
  gpus?: number;
  datasets?: string[];
}

export const postSwitch = (body: ISwitchRequest) =>
  request<{ options: any; allocation_id: string }>('switch', {
    method: 'POST',
    body: JSON.stringify(body)
  });

/** One poll during a restart: which server process answers (no log-in needed)? */
export async function pollServer(): Promise<IServerId | null> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 3000);
  try {
    const response = await fetch(apiUrl('ping'), {
      cache: 'no-store',
      credentials: 'omit',
      signal: controller.signal
    });
    if (!response.ok) {
      return null;
    }
    return (await response.json()) as IServerId;
  } finally {
    clearTimeout(timer);
  }
}
