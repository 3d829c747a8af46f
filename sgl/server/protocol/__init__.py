"""Request and response bodies (pydantic v2), so /docs and /openapi.json describe the real API:
one module per API (native, openai, programs and extraction, server info), their common bases,
the sampling fields derived from the runtime's parameter table, and the declared error and
event-stream responses. The names are re-exported here, where the routes import them.
"""

from sgl.server.protocol.common import (  # noqa: F401
    PERSON_SCHEMA_EXAMPLE,
    exactly_one_of,
)
from sgl.server.protocol.info import (  # noqa: F401
    ChatRoles,
    HealthResponse,
    LoadReport,
    ModelInfo,
    ServerInfo,
)
from sgl.server.protocol.native import (  # noqa: F401
    GENERATE_EXAMPLES,
    AbortRequest,
    CloseSessionReqInput,
    ConcateAndAppendReqInput,
    DetokenizeRequest,
    DetokenizeResponse,
    GenerateChunk,
    GenerateOutput,
    GenerateReqInput,
    OpenSessionReqInput,
    ProfileReqInput,
    SessionParams,
    TokenizeRequest,
    TokenizeResponse,
)
from sgl.server.protocol.openai import (  # noqa: F401
    CHAT_EXAMPLES,
    COMPLETION_EXAMPLES,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessage,
    ChatResponseMessage,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    ModelCard,
    ModelList,
    NamedFunction,
    NamedToolChoice,
    OpenAISamplingFields,
    PromptTokensDetails,
    ResponseFormat,
    StreamOptions,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolCallDeltaFunction,
    TopLogprob,
    Usage,
)
from sgl.server.protocol.programs import (  # noqa: F401
    EXTRACT_EXAMPLES,
    RUN_PROGRAM_EXAMPLES,
    ExtractRequest,
    ExtractResponse,
    ProgramResult,
    ProgramResultEvent,
    ProgramTextEvent,
    ProgramUsage,
    RunProgramRequest,
)
from sgl.server.protocol.responses import (  # noqa: F401
    COMMON_ERROR_STATUSES,
    ErrorDetail,
    ErrorResponse,
    SuccessResponse,
    error_responses,
    event_data_schema,
    sse_responses,
)
from sgl.server.protocol.sampling import (  # noqa: F401
    SAMPLING_PARAMS_SCHEMA,
    SamplingParamsSpec,
    v1_extension_fields,
)
