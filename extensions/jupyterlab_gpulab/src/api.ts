// Calls to this server's gpulab API (the server extension), which talks to the hub and billing.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IBalance, ICatalog, IPool, IStatus } from './logic';

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
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
    const message =
      data && typeof data.message === 'string'
        ? data.message
        : `HTTP ${response.status} from ${path}`;
    throw new ApiError(response.status, message);
  }
  return data as T;
}

export const getStatus = () => request<IStatus>('status');
export const getBalance = () => request<IBalance>('balance');
export const getCatalog = () => request<ICatalog>('catalog');
export const getPool = () => request<IPool>('pool');
export const getGpus = () => request<any>('gpus');

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

/** One status poll for the restart wait: plain fetch (follows the hub's OAuth redirects). */
export async function pollStatus(): Promise<IStatus | null> {
  const response = await fetch(apiUrl('status'), {
    cache: 'no-store',
    credentials: 'same-origin',
    headers: { Accept: 'application/json' }
  });
  if (!response.ok) {
    return null;
  }
  try {
    return (await response.json()) as IStatus;
  } catch {
    return null;
  }
}
